"""Corpus preparation: the embedded default, user files, and refusals of bad paths."""

from __future__ import annotations

import numpy as np
import pytest

from phalanx.data.corpus import prepare, split_chunks, stdlib_files
from phalanx.data.sources import find_source
from phalanx.errors import UserError


def test_embedded_corpus_is_the_stdlib_without_tests():
    files = stdlib_files()
    assert len(files) > 100
    assert not any("test" in f.parts[-2:-1] for f in files)
    assert any(f.name == "argparse.py" for f in files)


def test_prepare_caches_and_splits(tmp_path, corpus_file):
    splits = prepare(str(corpus_file), str(tmp_path), 0.1)
    assert splits.n_train + splits.n_val == corpus_file.stat().st_size
    assert 0.05 < splits.n_val / (splits.n_train + splits.n_val) < 0.15
    again = prepare(str(corpus_file), str(tmp_path), 0.1)  # from the cache
    assert again == splits
    assert bytes(splits.load("train")[:10]) == corpus_file.read_bytes()[:10]


def test_split_takes_validation_from_all_over():
    tokens = np.arange(100_000, dtype=np.int64)
    train, val = split_chunks(tokens, 0.1)
    assert len(train) + len(val) == len(tokens)
    assert val.min() < 30_000 and val.max() > 90_000


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    (b"", "holds no usable text: its files are empty"),
    (b"\x00\x01\x02binary\xff" * 100, "holds no usable text: `.*data.txt` is binary "
                                       r"\(it has NUL bytes\)"),
    ("café crème\n".encode("latin-1") * 50, r"`.*data.txt` is not UTF-8 \(byte 0xe9 at "
                                            r"offset 3; Latin-1 or another 8-bit encoding\?\)"
                                            ".*iconv -f latin1"),
])
def test_bad_data_paths_are_refused(tmp_path, content, needle):
    path = tmp_path / "data.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError, match=needle):
        prepare(str(path), str(tmp_path / "cache"), 0.05)


def test_empty_directory_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(UserError, match="contains no files"):
        find_source(str(tmp_path / "d"))


def test_phalanx_outputs_inside_data_are_refused(tmp_path, monkeypatch):
    from phalanx.config.sections import build_config
    from phalanx.data.corpus import check_data

    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("some text\n" * 50)
    monkeypatch.chdir(data)
    cfg = build_config({"data": {"path": ".", "cache_dir": str(tmp_path / "cache")}})
    with pytest.raises(UserError, match=r"^`--out` `runs/r` is inside `--data` `\.`: the run "
                                        r"would train on its own logs"):
        check_data(cfg.data, "runs/r")  # (not made yet: its files would be, later)
    check_data(cfg.data, ".runs/r")  # a hidden folder is not walked
    check_data(cfg.data, str(tmp_path / "r"))
    with pytest.raises(UserError, match=r"`--cache-dir` `.*/data/c` is inside `--data` `\.`: "
                                        r"the run would train on the token cache"):
        prepare(".", str(data / "c"), 0.1)
    assert sorted(p.name for p in data.iterdir()) == ["a.txt"]  # nothing written
