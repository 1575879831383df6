"""Small hardening items (issue 11): a damaged token cache is rebuilt, a torn metrics
line is skipped and said once, a closed output pipe ends quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from phalanx.data.corpus import prepare
from phalanx.report.metrics import read_metrics


def test_a_damaged_token_cache_is_rebuilt(tmp_path, small_corpus_file):
    first = prepare(str(small_corpus_file), str(tmp_path), 0.05, log=lambda m: None)
    meta = first.train.parent / "meta.json"
    for damage in ("{not json", json.dumps({"n_train": "x"}), json.dumps([1, 2])):
        meta.write_text(damage)
        said: list[str] = []
        again = prepare(str(small_corpus_file), str(tmp_path), 0.05, log=said.append)
        assert (again.n_train, again.n_val) == (first.n_train, first.n_val)
        assert said == [f"note: the token cache in `{first.train.parent}` is damaged; "
                        f"rebuilding it."]
        assert json.loads(meta.read_text())["n_train"] == first.n_train
    first.train.write_bytes(b"short")  # a split file of the wrong size
    again = prepare(str(small_corpus_file), str(tmp_path), 0.05, log=lambda m: None)
    assert again.train.stat().st_size == first.n_train


def test_a_torn_metrics_tail_is_skipped_and_said_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    said: list[str] = []
    assert [r["step"] for r in read_metrics(path, warn=said.append)] == [1, 2]
    assert len(said) == 1 and "ends with a torn line" in said[0]
    path.write_text('{"step": 1}\ngarbage\n[1]\n{"step": 4}\n')
    said.clear()
    assert [r["step"] for r in read_metrics(path, warn=said.append)] == [1, 4]
    assert said == [f"warning: `{path}` has 2 unreadable line(s) (2, 3); skipped."]


def test_output_into_a_closed_pipe_ends_quietly():
    read, write = os.pipe()
    os.close(read)  # like `| head` that has already exited
    try:
        proc = subprocess.run([sys.executable, "-m", "phalanx", "lint", "--explain", "PX101"],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_a_full_or_read_only_disk_is_the_users_error_and_nothing_else_is():
    import errno

    from phalanx.errors import StorageFull, storage_errors

    with pytest.raises(StorageFull, match=r"^No space left on device writing `/r/m.jsonl`\. "
                                          r"Free space or choose a writable location"):
        with storage_errors("/r"):
            raise OSError(errno.ENOSPC, "No space left on device", "/r/m.jsonl")
    with pytest.raises(StorageFull, match=r"^Read-only file system writing into `/r`\."):
        with storage_errors("/r"):
            raise OSError(errno.EROFS, "Read-only file system")  # no file named: the run's
    with pytest.raises(StorageFull, match=r"^Disk quota exceeded\. Free space"):
        with storage_errors():
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
    with pytest.raises(PermissionError):  # not the disk: unchanged, with its traceback
        with storage_errors("/r"):
            raise PermissionError(errno.EACCES, "Permission denied", "/r/x")


def test_gradient_norms_are_read_in_one_copy_and_kept_as_floats():
    import torch

    from phalanx.train.logger import _settle_norms

    norms = [torch.tensor(1.0), None, torch.tensor(2.0, dtype=torch.float64),
             torch.tensor(4.0)]
    assert _settle_norms(norms, 3) == 3.0  # the window's norms that were taken
    assert isinstance(norms[0], torch.Tensor) and norms[1:] == [None, 2.0, 4.0]  # floats now
    assert _settle_norms(norms, 4) == pytest.approx(7 / 3) and norms[0] == 1.0
    assert _settle_norms([None, None], 2) is None and _settle_norms([], 0) is None


def test_a_full_disk_at_the_out_probe_says_full_and_read_only_says_not_writable(
        tmp_path, monkeypatch):
    import errno

    from phalanx.checkpoint import rundir
    from phalanx.errors import StorageFull, UserError

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(rundir, "create_new", full)
    with pytest.raises(StorageFull, match=rf"^No space left on device writing `{tmp_path}/"
                                          r"\.phalanx-write-test-\d+`\. Free space"):
        rundir.prepare_out_dir(str(tmp_path))

    def read_only(path, text):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(rundir, "create_new", read_only)
    with pytest.raises(UserError, match=r"is not a writable directory \(Read-only file system"):
        rundir.prepare_out_dir(str(tmp_path))


def test_json_nested_too_deeply_is_refused_like_any_bad_json(tmp_path):
    """A planted manifest.json or train_state.json nested 50,000 levels deep: Python's
    parser raised RecursionError (a traceback through `--resume auto`'s scan and export);
    now the checkpoint is refused like any other unreadable one, in one line."""
    from phalanx.checkpoint.manifest import listed_files
    from phalanx.checkpoint.store import read_sidecar
    from phalanx.errors import UserError

    deep = "[" * 50_000 + "]" * 50_000
    (tmp_path / "manifest.json").write_text('{"files": ' + deep + "}")
    (tmp_path / "train_state.json").write_text(deep)
    assert listed_files(tmp_path) == ({}, "manifest is not valid JSON with a `files` table")
    with pytest.raises(UserError, match=r"`train_state.json` is not readable JSON \(nested "
                                        r"too deeply to read"):
        read_sidecar(tmp_path)
