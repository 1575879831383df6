"""Hang diagnosis pieces without processes: torch's mismatch message in plain words, a
faulthandler dump read back, the report's cause for each situation, and the doctor's
rendezvous naming ranks that never joined."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from phalanx.doctor.worker import wait_for_peers
from phalanx.errors import DistributedError
from phalanx.hang.crash import main_stack_from_dump
from phalanx.hang.mismatch import explain
from phalanx.hang.report import likely_cause
from phalanx.hang.stacks import Activity, Frame

TORCH_MESSAGE = (
    "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=5, OpType=ALLREDUCE, TensorShape=[3], "
    "TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu)), "
    "but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=5, "
    "OpType=BROADCAST, TensorShape=[3], TensorDtypes=Double, TensorDeviceTypes=TensorOptions("
    "dtype=float (default), device=cpu)).Collectives differ in the following aspects: ...")


def test_a_mismatch_is_said_in_plain_words():
    plain = explain(RuntimeError(TORCH_MESSAGE))
    assert str(plain) == (
        "[rank 0] collective mismatch at collective #5: rank 0 runs allreduce of float32[3], "
        "but rank 1 runs broadcast of float64[3] — the operations and dtypes differ. Every "
        "rank must call the same collectives in the same order with the same shapes and "
        "dtypes.")
    assert explain(RuntimeError("CUDA out of memory")) is None


def test_a_faulthandler_dump_gives_the_main_thread_outermost_first():
    dump = """main-thread 0x00007f0000000001
Fatal Python error: Aborted

Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000001 (most recent call first):
  File "/x/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/work/train.py", line 58 in evaluate
  File "/work/train.py", line 90 in main
"""
    stack = main_stack_from_dump(dump)
    assert [(f.file, f.line, f.function) for f in stack] == [
        ("/work/train.py", 90, "main"), ("/work/train.py", 58, "evaluate"),
        ("/x/torch/distributed/distributed_c10d.py", 3252, "all_reduce")]


def _at(line: int, collective: str | None, condition: str | None = None) -> Activity:
    return Activity(collective, Frame("train.py", line, "main"), ["main"], condition)


def test_the_likely_cause_for_each_situation():
    assert "did not answer" in likely_cause({0: _at(5, "barrier")}, [1], 2)
    same = likely_cause({0: _at(5, "all_reduce"), 1: _at(5, "all_reduce")}, [], 2)
    assert same.startswith("every rank is in all_reduce at train.py:5")
    assert "outside torch.distributed" in likely_cause({0: _at(9, None), 1: _at(9, None)}, [], 2)
    cond = likely_cause({0: _at(5, "barrier", "`if rank == 0:` at train.py:4"),
                         1: _at(8, "all_reduce")}, [], 2)
    assert cond.startswith("rank(s) 0 are in barrier at train.py:5 in main(), reached only "
                           "under `if rank == 0:` at train.py:4; rank 1 is in all_reduce at "
                           "train.py:8 in main() — they never join it."), cond
    order = likely_cause({0: _at(5, "barrier"), 1: _at(8, "all_reduce")}, [], 2)
    assert "different places" in order and "same order" in order


def test_the_doctor_names_ranks_that_never_joined():
    store = dist.HashStore()
    store.set("joined/1", "1")
    with pytest.raises(DistributedError, match=r"rank\(s\) 2 of 3 never joined within 0.3 s"):
        wait_for_peers(store, 0, 3, 0.3)
    store.set("joined/2", "1")
    wait_for_peers(store, 0, 3, 0.3)
