"""A CUDA out-of-memory in plain words (runtime.memory_history): with the allocator's
history recorded, the snapshot is written into the run directory and the line names it and
how to view it; without, the line says how to record it. The snapshot writer is torch's
(`torch.cuda.memory._dump_snapshot`), replaced here by one that writes a file: on CPU there
is no allocator history (tests/cuda/test_cuda_memory.py runs the real one on a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.errors import DistributedError, UserError
from phalanx.runtime.memory_history import check_entries, explain_oom, start

OOM = "CUDA out of memory. Tried to allocate 80.00 GiB. GPU 0 has a total capacity of 79 GiB"


def test_recorded_the_snapshot_is_written_and_named(tmp_path: Path, monkeypatch):
    written: list[str] = []

    def dump(path: str) -> None:
        written.append(path)
        Path(path).write_bytes(b"snapshot")

    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    error = explain_oom(torch.OutOfMemoryError(OOM + "\nmore lines"), 1, 100000, tmp_path)
    assert isinstance(error, DistributedError) and written == [
        str(tmp_path / "memory-snapshot-rank-1.pickle")]
    assert str(error) == (f"[rank 1] {OOM} — the last 100000 allocator events are in "
                          f"{tmp_path}/memory-snapshot-rank-1.pickle: drag it onto "
                          f"https://pytorch.org/memory_viz to see what held the memory.")


def test_not_recorded_says_how_and_other_errors_are_left_alone(tmp_path: Path):
    error = str(explain_oom(torch.OutOfMemoryError(OOM), 0, 0, tmp_path))
    assert "run again with `--memory-history 100000`" in error and "memory_viz" in error
    assert explain_oom(RuntimeError("boom"), 0, 100000, tmp_path) is None
    assert not list(tmp_path.iterdir())


def test_cpu_records_nothing_and_a_bad_count_is_one_line(tmp_path: Path):
    assert start(torch.device("cpu"), 1000) == 0
    with pytest.raises(UserError, match="give the number of allocator events"):
        check_entries(-1)


def test_an_oom_leaving_a_run_is_said_in_one_line(tmp_path: Path):
    with pytest.raises(DistributedError, match=r"\[rank 0\] CUDA out of memory.*--memory-"
                                               r"history 100000"):
        with phalanx.init(seed=0, threads=1, out=tmp_path, memory_history=1000):
            raise torch.OutOfMemoryError(OOM)
