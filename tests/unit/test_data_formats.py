"""`--data` formats: detection, JSON Lines, Parquet/Arrow, a saved Hugging Face dataset,
pre-tokenized `train.bin`/`val.bin`, and their refusals (one line, nothing cached)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from phalanx.data.corpus import prepare
from phalanx.data.sources import find_source
from phalanx.errors import UserError

QUIET = dict(log=lambda line: None)
DOCS = [f"document {i}: café {'x' * (i % 7)} 東京\nline two of {i}" for i in range(300)]
JOINED = "\n\n".join(DOCS).encode()


def _jsonl(path, docs=DOCS, field="text"):
    path.write_text("".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)))
    return path


def _text_of(splits) -> bytes:
    return bytes(splits.load("train")) + bytes(splits.load("val"))


def test_detection_rules(tmp_path):
    (tmp_path / "bins").mkdir()
    for name in ("train.bin", "val.bin"):
        (tmp_path / "bins" / name).write_bytes(b"\0\0")
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dataset_dict.json").write_text("{}")
    (tmp_path / "t.txt").write_text("hi")
    assert find_source(str(tmp_path / "bins")).kind == "bins"
    assert find_source(str(tmp_path / "ds")).kind == "dataset"
    assert find_source(str(tmp_path / "t.txt")).kind == "text"
    assert find_source(None).kind == "text"
    with pytest.raises(UserError, match="give the folder that holds both `train.bin` and"):
        find_source(str(tmp_path / "bins" / "train.bin"))


def test_jsonl_records_are_the_documents(tmp_path):
    splits = prepare(str(_jsonl(tmp_path / "d.jsonl")), str(tmp_path / "c"), 0.1, **QUIET)
    assert splits.n_train + splits.n_val == len(JOINED)
    assert sorted(_text_of(splits)) == sorted(JOINED)  # every byte, once
    assert "300 documents" in splits.description
    other = prepare(str(_jsonl(tmp_path / "d.jsonl", field="body")), str(tmp_path / "c"), 0.1,
                    text_field="body", **QUIET)
    assert other.train.parent != splits.train.parent  # the field is in the cache key


def test_a_jsonl_without_the_field_is_one_line_and_caches_nothing(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine"}\n\n{"body": "x", "id": 2}\n')
    with pytest.raises(UserError) as info:
        prepare(str(path), str(tmp_path / "cache"), 0.1, tokenizer="bpe:300", **QUIET)
    assert str(info.value) == (f"`{path}` line 3 has no field `text` (its fields: `body`, "
                               f"`id`). Name the text field with `--text-field`.")
    assert not (tmp_path / "cache").exists()  # nor any temporary file in it
    path.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(UserError, match="line 2 is not JSON"):
        prepare(str(path), str(tmp_path / "cache"), 0.1, **QUIET)


def test_a_deeply_nested_jsonl_line_is_one_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "x", "a": ' + "[" * 100_000 + "]" * 100_000
                    + "}\n")
    with pytest.raises(UserError) as info:
        prepare(str(path), str(tmp_path / "cache"), 0.1, **QUIET)
    assert str(info.value).startswith(f"`{path}` line 2 is nested too deeply")
    assert not (tmp_path / "cache").exists()


def test_parquet_arrow_and_a_saved_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(DOCS))), "text": DOCS})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=50)
    with pa.ipc.new_stream(str(tmp_path / "d.arrow"), table.schema) as writer:
        writer.write_table(table, max_chunksize=64)
    with pa.ipc.new_file(str(tmp_path / "file.arrow"), table.schema) as writer:  # IPC file
        writer.write_table(table, max_chunksize=64)  # format: several batches
    feather.write_feather(table, tmp_path / "f.arrow")  # (pandas to_feather, polars write_ipc)
    ds = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS}),
                               "test": datasets.Dataset.from_dict({"text": ["other"]})})
    ds.save_to_disk(str(tmp_path / "saved"))
    for path in ("d.parquet", "d.arrow", "file.arrow", "f.arrow", "saved"):
        splits = prepare(str(tmp_path / path), str(tmp_path / "c"), 0.1, **QUIET)
        assert sorted(_text_of(splits)) == sorted(JOINED), path
    with pytest.raises(UserError, match=r"has no column `body` \(its columns: `id`, `text`\)"):
        prepare(str(tmp_path / "d.parquet"), str(tmp_path / "c"), 0.1, text_field="body")


def test_without_datasets_the_error_says_what_to_install(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": DOCS}), tmp_path / "d.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow: ImportError
    with pytest.raises(UserError, match=r"needs the `datasets` package: pip install "
                                        r"'phalanx\[data\]'"):
        prepare(str(tmp_path / "d.parquet"), str(tmp_path / "c"), 0.1, **QUIET)


def _bins(folder, train, val, dtype):
    folder.mkdir(exist_ok=True)
    np.asarray(train, dtype=dtype).tofile(folder / "train.bin")
    np.asarray(val, dtype=dtype).tofile(folder / "val.bin")
    return str(folder)


def test_bins_are_used_in_place(tmp_path):
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 1000, 5000), rng.integers(0, 1000, 500)
    said: list[str] = []
    s = prepare(_bins(tmp_path / "b", train, val, np.uint16), str(tmp_path / "c"), log=said.append)
    assert (s.n_train, s.n_val, s.dtype) == (5000, 500, "uint16")
    assert s.vocab_size == max(train.max(), val.max()) + 1 and s.tokenizer() is None
    assert np.array_equal(s.load("train"), train) and s.train == tmp_path / "b" / "train.bin"
    assert "the vocabulary is the largest id + 1" in said[0]
    kept = list((tmp_path / "c").iterdir())  # nothing copied: the scans' records only
    assert len(kept) == 2 and all(p.name.startswith("bins-") and p.stat().st_size < 500
                                  for p in kept), kept
    big = prepare(_bins(tmp_path / "b32", train + 70_000, val, np.uint32), None,
                  bin_dtype="uint32", **QUIET)
    assert big.vocab_size == train.max() + 70_001 and big.dtype == "uint32"
    small = prepare(_bins(tmp_path / "b8", train % 256, val % 256, np.uint16), None, **QUIET)
    assert small.tokenizer_kind == "bytes" and small.vocab_size == 256


def test_a_bins_scan_is_remembered_per_version_of_the_file(tmp_path, monkeypatch):
    import os

    from phalanx.data import bins

    scans: list[str] = []
    real = bins._scan
    monkeypatch.setattr(bins, "_scan", lambda path, dtype: scans.append(path.name) or
                        real(path, dtype))
    folder = _bins(tmp_path / "b", np.arange(3000) % 700, np.arange(300), np.uint16)
    first = prepare(folder, str(tmp_path / "c"), **QUIET)
    assert scans == ["train.bin", "val.bin"]
    again = prepare(folder, str(tmp_path / "c"), **QUIET)  # another rank, a restart
    assert scans == ["train.bin", "val.bin"] and again.vocab_size == first.vocab_size == 700
    st = os.stat(tmp_path / "b" / "train.bin")
    os.utime(tmp_path / "b" / "train.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    prepare(folder, str(tmp_path / "c"), **QUIET)  # a new version of train.bin: read again
    assert scans == ["train.bin", "val.bin", "train.bin"]
    for record in (tmp_path / "c").glob("bins-*.json"):
        record.write_text("not json")  # a damaged record: scanned again, not trusted
    assert prepare(folder, str(tmp_path / "c"), **QUIET).vocab_size == 700
    assert len(scans) == 5
    val = tmp_path / "b" / "val.bin"  # rewritten in place, same size, its mtime put back:
    st = os.stat(val)  # the record of the old version is stale (it said ids < 700)
    (np.arange(300, dtype=np.uint16) + 900).tofile(val)
    os.utime(val, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert prepare(folder, str(tmp_path / "c"), **QUIET).vocab_size == 1200
    assert scans[5:] == ["val.bin"]
    named = {Path(json.loads(p.read_text())["file"][0]).name: p  # by the file each record
             for p in (tmp_path / "c").glob("bins-*.json")  # names (not by mtime order)
             if p.read_text() != "not json"}  # (one damaged above and never rewritten)
    named["val.bin"].write_bytes(named["train.bin"].read_bytes())  # another file's record
    assert prepare(folder, str(tmp_path / "c"), **QUIET).vocab_size == 1200
    assert scans[6:] == ["val.bin"]


@pytest.mark.parametrize("written, read, needle", [
    (np.uint32, "uint16", "0 at every other position: it looks like uint32 ids. Pass "
                          "`--bin-dtype uint32`"),
    (np.uint16, "uint32", "is 10,002 bytes, not a whole number of uint32 ids"),
    (np.uint16, "uint32!", "no vocabulary is that large, so the dtype is likely wrong"),
])
def test_bins_of_the_wrong_dtype_are_one_line(tmp_path, written, read, needle):
    rng = np.random.default_rng(1)
    n = 5001 if read == "uint32" else 5000
    folder = _bins(tmp_path / "b", rng.integers(1, 1000, n), rng.integers(1, 1000, 500),
                   written)
    with pytest.raises(UserError, match=needle.replace("(", r"\(")) as info:
        prepare(folder, str(tmp_path / "c"), bin_dtype=read.rstrip("!"), **QUIET)
    assert "\n" not in str(info.value)


def test_bin_ids_beyond_the_tokenizer_are_refused(tmp_path):
    from phalanx.data.tokenizer import train_bpe

    tok = train_bpe(["some text to learn from " * 50], 300)
    tok.tok.save(str(tmp_path / "tok.json"))
    v = tok.vocab_size
    folder = _bins(tmp_path / "b", np.arange(2000) % (v + 1), np.arange(100), np.uint16)
    with pytest.raises(UserError, match=f"holds token id {v}, beyond the {v} ids of the "
                                        f"tokenizer"):
        prepare(folder, None, tokenizer=str(tmp_path / "tok.json"), **QUIET)
    ids = tok.encode("some text")
    ok = prepare(_bins(tmp_path / "b", ids * 100, ids * 10, np.uint16), None,
                 tokenizer=str(tmp_path / "tok.json"), **QUIET)
    assert ok.vocab_size == v and ok.tokenizer().decode(ok.load("val")[:len(ids)]) == "some text"


def test_concurrent_builders_make_one_cache(tmp_path, corpus_file):
    code = ("import sys; from phalanx.data.corpus import prepare; "
            "s = prepare(sys.argv[1], sys.argv[2], 0.1, tokenizer='bpe:300'); "
            "print(s.train.parent, s.n_train)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(corpus_file), str(tmp_path)],
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    lines = [o.strip().splitlines()[-1] for o in outs]
    assert len(set(lines)) == 1
    assert sum("training a 300-id BPE" in o for o in outs) == 1  # one process trained it
    assert [p.name for p in tmp_path.iterdir()] == [lines[0].split()[0].rsplit("/", 1)[1]]


def test_a_large_text_file_is_read_in_blocks(tmp_path, monkeypatch):
    from phalanx.data import sources

    text = ("naïve 東京 🙂 " * 500).encode()
    (tmp_path / "a.txt").write_bytes(text)
    small = prepare(str(tmp_path / "a.txt"), str(tmp_path / "c1"), 0.1, **QUIET)
    monkeypatch.setattr(sources, "BIG_FILE", 100)
    monkeypatch.setattr(sources, "BLOCK", 7)  # blocks cut characters
    big = prepare(str(tmp_path / "a.txt"), str(tmp_path / "c2"), 0.1, **QUIET)
    assert bytes(big.load("train")) == bytes(small.load("train"))
    assert bytes(big.load("val")) == bytes(small.load("val"))
    for at in (5, 1000, len(text) - 1):
        bad = text[:at] + b"\xe9" + text[at + 1:]
        (tmp_path / "b.txt").write_bytes(bad)
        expected = sources._not_utf8(bad)
        assert sources._check_large(tmp_path / "b.txt")[1] == expected
    (tmp_path / "c.txt").write_bytes(text[:-2])  # ends inside the last 🙂
    assert "not UTF-8" in sources._check_large(tmp_path / "c.txt")[1]


def test_a_lone_surrogate_in_jsonl_is_one_line(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "fine"}\n{"text": "half \\ud800 a character"}\n')
    with pytest.raises(UserError, match="line 2.*lone UTF-16 surrogate"):
        prepare(str(data), str(tmp_path / "cache"), 0.1)


def test_bins_with_a_bpe_to_train_are_refused(tmp_path):
    for name in ("train.bin", "val.bin"):
        np.arange(100, dtype=np.uint16).tofile(tmp_path / name)
    with pytest.raises(UserError, match="holds token ids already.*--tokenizer auto"):
        prepare(str(tmp_path), str(tmp_path / "cache"), 0.1, tokenizer="bpe:300")
