"""Hang diagnosis pieces without processes: torch's mismatch message in plain words, a
faulthandler dump read back, the report's cause for each situation, the collective behind
a call named from real torch stacks (FSDP2, FSDP1, DDP, ZeRO, DCP, DTensor), uneven inputs,
and the doctor's rendezvous naming ranks that never joined."""

from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from phalanx.doctor.rank_checks import wait_for_peers
from phalanx.errors import DistributedError
from phalanx.hang.collectives import module_called
from phalanx.hang.crash import main_stack_from_dump
from phalanx.hang.diagnosis import likely_cause
from phalanx.hang.mismatch import explain
from phalanx.hang.stacks import Activity, Frame, describe, rank_stack
from phalanx.hang.uneven import ended_early, loop_left
from phalanx.hang.watchdog import Beat

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
    p2p = likely_cause({0: _at(9, "barrier"), 1: _at(7, "recv", "`if rank == 1:` at "
                                                       "train.py:6")}, [], 2)
    assert p2p.startswith("rank(s) 1 wait in recv at train.py:7 in main() for a peer that "
                          "never matches it; rank 0 is in barrier at train.py:9") and \
        "Every recv needs a send" in p2p and "every rank" not in p2p, p2p


def test_the_doctor_names_ranks_that_never_joined():
    store = dist.HashStore()
    store.set("joined/1", "1")
    with pytest.raises(DistributedError, match=r"rank\(s\) 2 of 3 never joined within 0.3 s"):
        wait_for_peers(store, 0, 3, 0.3)
    store.set("joined/2", "1")
    wait_for_peers(store, 0, 3, 0.3)


# -- the collective behind the call, from real stacks (torch 2.13, gloo, CPU) -----------

TORCH = "/venv/lib/python3.11/site-packages/torch/"
MODULE_CALL = ["nn/modules/module.py:1778:_wrapped_call_impl", "nn/modules/module.py:1884:"
               "_call_impl", "nn/modules/module.py:1811:inner"]
FSDP2_FORWARD = MODULE_CALL + [
    "distributed/fsdp/_fully_shard/_fsdp_state.py:314:_pre_forward",
    "distributed/fsdp/_fully_shard/_fsdp_param_group.py:551:pre_forward",
    "distributed/fsdp/_fully_shard/_fsdp_param_group.py:407:unshard",
    "distributed/fsdp/_fully_shard/_fsdp_collectives.py:364:foreach_all_gather",
    "distributed/fsdp/_fully_shard/_fsdp_collectives.py:119:__call__",
    "distributed/distributed_c10d.py:4394:all_gather_single"]
BACKWARD = ["_tensor.py:623:backward", "autograd/__init__.py:395:backward",
            "autograd/graph.py:979:_engine_run_backward"]
FSDP2_REDUCE = BACKWARD + [
    "autograd/function.py:325:apply",
    "distributed/fsdp/_fully_shard/_fsdp_param_group.py:1126:backward",
    "distributed/fsdp/_fully_shard/_fsdp_param_group.py:688:post_backward",
    "distributed/fsdp/_fully_shard/_fsdp_collectives.py:619:foreach_reduce",
    "distributed/fsdp/_fully_shard/_fsdp_collectives.py:184:__call__",
    "distributed/distributed_c10d.py:4943:reduce_scatter_single"]
FSDP2_REGATHER = BACKWARD + [
    "distributed/fsdp/_fully_shard/_fsdp_state.py:386:_pre_backward",
    "distributed/fsdp/_fully_shard/_fsdp_param_group.py:582:pre_backward",
    "distributed/fsdp/_fully_shard/_fsdp_param_group.py:407:unshard",
    "distributed/fsdp/_fully_shard/_fsdp_collectives.py:364:foreach_all_gather",
    "distributed/distributed_c10d.py:4394:all_gather_single"]
FSDP1_FORWARD = ["distributed/fsdp/fully_sharded_data_parallel.py:850:forward",
                 "distributed/fsdp/_runtime_utils.py:420:_pre_forward_unshard",
                 "distributed/fsdp/_runtime_utils.py:300:_unshard",
                 "distributed/fsdp/_flat_param.py:1380:unshard",
                 "distributed/fsdp/_flat_param.py:1476:_all_gather_flat_param",
                 "distributed/distributed_c10d.py:4394:all_gather_single"]
FSDP1_REDUCE = BACKWARD + ["distributed/fsdp/_runtime_utils.py:760:_post_backward_hook",
                           "distributed/fsdp/_runtime_utils.py:858:_reduce_grad",
                           "distributed/distributed_c10d.py:4943:reduce_scatter_single"]
DDP_BUFFERS = ["nn/parallel/distributed.py:1886:forward",
               "nn/parallel/distributed.py:1782:_pre_forward",
               "nn/parallel/distributed.py:2425:_sync_buffers",
               "nn/parallel/distributed.py:2363:_distributed_broadcast_coalesced"]
ZERO_STEP = ["optim/optimizer.py:530:wrapper",
             "distributed/optim/zero_redundancy_optimizer.py:1151:step",
             "distributed/optim/zero_redundancy_optimizer.py:826:_sync_params"]
ZERO_CONSOLIDATE = [
    "distributed/optim/zero_redundancy_optimizer.py:564:consolidate_state_dict",
    "distributed/optim/zero_redundancy_optimizer.py:111:_broadcast_object",
    "distributed/distributed_c10d.py:3151:broadcast"]
DCP_SAVE = ["distributed/checkpoint/state_dict_saver.py:196:save",
            "distributed/checkpoint/state_dict_saver.py:487:_save_state_dict",
            "distributed/checkpoint/utils.py:135:gather_object",
            "distributed/distributed_c10d.py:4287:all_gather"]
DTENSOR_FULL = ["distributed/tensor/_api.py:774:full_tensor",
                "distributed/tensor/_api.py:731:redistribute",
                "distributed/tensor/_redistribute.py:1918:forward",
                "distributed/_functional_collectives.py:142:wait_tensor"]


def _torch(spec: list[str], code: str = "") -> list[Frame]:
    frames = []
    for item in spec:
        path, line, function = item.split(":")
        frames.append(Frame(TORCH + path, int(line), function, code))
    return frames


TRAIN = """import torch.distributed as dist
from evaluation import evaluate

for epoch in range(3):
    for batch in batches:
        loss = model(batch).sum()
        loss.backward()
        opt.step()
    if rank == 0:
        print(evaluate(model, batch))
    dist.barrier()
dist.destroy_process_group()
"""
EVALUATION = "def evaluate(model, batch):\n    return model(batch).sum().item()\n"


@pytest.fixture
def train(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evaluation.py").write_text(EVALUATION)
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path


def _user(train, line: int) -> list[Frame]:
    code = TRAIN.splitlines()[line - 1].strip()
    return [Frame(str(train / "train.py"), line, "<module>", code)]


def _in_eval(train) -> list[Frame]:
    return _user(train, 10) + [Frame(str(train / "evaluation.py"), 2, "evaluate",
                                     "return model(batch).sum().item()")]


def test_fsdp2_forward_all_gather_names_the_module_and_the_rank_condition(train):
    evaluating = describe(_in_eval(train) + _torch(FSDP2_FORWARD), frozenset({"FSDPModule"}))
    assert evaluating.collective == "FSDP all-gather in the forward of `model`"
    assert evaluating.condition == "`if rank == 0:` at train.py:9"
    cause = likely_cause({0: evaluating, 1: describe(_user(train, 11) + _torch(
        ["distributed/distributed_c10d.py:4800:barrier"]))}, [], 2)
    assert cause.startswith(
        "rank(s) 0 are in FSDP all-gather in the forward of `model` at evaluation.py:2 in "
        "evaluate() (called from train.py:10), reached only under `if rank == 0:` at "
        "train.py:9; rank 1 is in barrier at train.py:11 in <module>() — they never join "
        "it."), cause


def test_fsdp_backward_collectives_are_told_apart_from_ddp(train):
    step = _user(train, 7)
    fsdp = frozenset({"FSDPModule"})
    assert describe(step + _torch(FSDP2_REDUCE), fsdp).collective == \
        "FSDP reduce-scatter in the backward"
    assert describe(step + _torch(FSDP2_REGATHER), fsdp).collective == \
        "FSDP all-gather in the backward"
    assert describe(step + _torch(FSDP1_REDUCE)).collective == \
        "FSDP reduce-scatter in the backward"
    assert describe(_user(train, 6) + _torch(FSDP1_FORWARD)).collective == \
        "FSDP all-gather in the forward of `model`"
    bare = step + _torch(BACKWARD)
    assert describe(bare, frozenset({"DistributedDataParallel"})).collective == \
        "DDP gradient all-reduce in the backward"
    assert "DDP" not in describe(bare, fsdp).collective
    assert describe(bare, frozenset()).collective == \
        "the backward (autograd; no collective visible in Python)"


def test_ddp_zero_dcp_and_dtensor_collectives_are_named(train):
    line = _user(train, 6)
    assert describe(line + _torch(DDP_BUFFERS)).collective == \
        "DDP buffer broadcast in the forward of `model`"
    rebuild = _torch(DDP_BUFFERS[:1]) + [Frame(TORCH + "nn/parallel/distributed.py", 1775,
                                               "_pre_forward", "if self.reducer._rebuild_buckets():")]
    assert describe(line + rebuild).collective == \
        "DDP bucket rebuild (broadcast) in the forward of `model`"
    assert describe(line + _torch(ZERO_STEP)).collective == \
        "ZeroRedundancyOptimizer.step's parameter broadcast"
    assert describe(line + _torch(ZERO_CONSOLIDATE)).collective == \
        "ZeroRedundancyOptimizer.consolidate_state_dict's broadcast of optimizer state"
    assert describe(line + _torch(DCP_SAVE)).collective == "DCP save (all_gather)"
    assert describe(line + _torch(DTENSOR_FULL)).collective == \
        "DTensor full_tensor's all-gather"
    assert describe(line + _torch(["distributed/distributed_c10d.py:1:all_gather_single"])
                    ).collective == "all_gather_single"
    sync_bn = _torch(DDP_BUFFERS[:1] + MODULE_CALL + [
        "nn/modules/_functions.py:60:forward", "distributed/distributed_c10d.py:1:all_gather"])
    assert describe(line + sync_bn).collective == \
        "SyncBatchNorm's all-gather of batch statistics in the forward of `model`"
    fsdp_save = _torch(DCP_SAVE[:1] + FSDP1_FORWARD[1:])  # the outermost wrapper names it
    assert describe(line + fsdp_save).collective == "DCP save (all_gather_single)"


def test_uneven_inputs_say_who_ran_more_and_the_fix(train):
    past = describe(_user(train, 12))  # destroy_process_group: not a collective
    still = describe(_user(train, 7) + _torch(BACKWARD), frozenset({"DistributedDataParallel"}))
    beats = {0: {"step": -1, "optimizer_steps": 3}, 1: {"step": -1, "optimizer_steps": 3}}
    cause = likely_cause({0: past, 1: still}, [], 2, beats)
    assert cause.startswith(
        "uneven inputs: rank 0 left the loop at train.py:4 and is outside any collective at "
        "train.py:12 in <module>(), while rank 1 is still in it, in DDP gradient all-reduce in "
        "the backward at train.py:7 in <module>() — the ranks ran a different number of "
        "iterations and rank 1 ran more (optimizer steps taken: rank 0: 3, rank 1: 3; rank 1 "
        "is in iteration 4)."), cause
    assert "drop_last=True" in cause and "torch.distributed.algorithms.Join" in cause
    at_barrier = describe(_user(train, 11) + _torch(["distributed/distributed_c10d.py:1:"
                                                      "barrier"]))
    cause = likely_cause({0: at_barrier, 1: still}, [], 2, {})
    assert "rank 0 left the loop at train.py:5 and is in barrier" in cause, cause
    assert "the iteration counts are not known" in cause
    steps = {0: {"step": 41}, 1: {"step": 42}}
    assert "last step reported: rank 0: 41, rank 1: 42" in likely_cause(
        {0: at_barrier, 1: still}, [], 2, steps)
    # both in the loop, at different lines: not uneven inputs
    in_step = describe(_user(train, 8) + _torch(ZERO_STEP))
    assert "different places" in likely_cause({0: in_step, 1: still}, [], 2)


def test_a_rank_that_returned_from_the_training_function_is_past_its_loop(tmp_path):
    source = "def train(data):\n    for b in data:\n        step(b)\n\n\ntrain(d)\nfinish()\n"
    path = str(tmp_path / "t.py")
    (tmp_path / "t.py").write_text(source)
    ahead = [Frame(path, 7, "<module>")]
    behind = [Frame(path, 6, "<module>"), Frame(path, 3, "train")]
    assert loop_left(ahead, behind) == Frame(path, 2, "train")
    assert loop_left(behind, ahead) is None


def test_the_module_a_line_calls():
    assert module_called("loss = model(x).sum()") == "model"
    assert module_called("h = self.encoder(x)") == "self.encoder"
    assert module_called("return model(batch).sum().item()") == "model"
    assert module_called("out = head(body(x))") is None
    assert module_called("print(torch.ones(3))") is None


def test_ranks_that_finished_the_script_are_not_reported_as_dead(train):
    still = describe(_user(train, 7) + _torch(BACKWARD), frozenset({"DistributedDataParallel"}))
    done = {0: {"step": -1, "optimizer_steps": 3}}
    beats = {1: {"step": -1, "optimizer_steps": 3}}
    cause = likely_cause({1: still}, [0], 2, beats, done)
    assert cause.startswith(
        "rank 0 finished the script while rank 1 is still in DDP gradient all-reduce in the "
        "backward at train.py:7 in <module>(): the ranks ran a different number of "
        "collectives — most likely uneven inputs: rank 1 ran more iterations (optimizer "
        "steps taken: rank 0: 3, rank 1: 3; rank 1 is in iteration 4)."), cause
    assert "did not answer" in likely_cause({1: still}, [0], 2, beats, {})


def test_a_peer_lost_because_its_script_ended_is_uneven_inputs(train):
    def backward():
        raise RuntimeError("Connection closed by peer [127.0.0.1]:1234")

    try:
        backward()
    except RuntimeError as exc:
        error = ended_early(exc, 1, {0: {"step": -1, "optimizer_steps": 5}},
                            Beat(optimizer_steps=5))
    assert str(error).startswith(
        "[rank 1] uneven inputs: rank 0 finished the script while rank 1 was still in a "
        "collective at "), str(error)
    assert "test_hang_report.py:" in str(error) and "in backward() —" in str(error)
    assert "rank 1 ran more iterations (optimizer steps taken: rank 0: 5, rank 1: 5; rank 1 "\
           "is in iteration 6)" in str(error)


def test_a_backward_waiting_in_autograd_shows_the_hook_thread_in_a_collective():
    """On a GPU autograd runs FSDP's backward hooks on its device thread while the main
    thread waits in `_engine_run_backward`: the stack sent for the report joins the two."""
    import threading

    def torch_function(path: str, name: str, body: str):
        scope: dict = {"time": time}
        exec(compile(f"def {name}(event):\n    {body}\n", TORCH + path, "exec"), scope)
        return scope[name]

    # time.sleep, like autograd's C++ engine, adds no Python frame
    engine = torch_function("autograd/graph.py", "_engine_run_backward", "time.sleep(0.6)")
    collective = torch_function("distributed/distributed_c10d.py", "reduce_scatter_single",
                                "event.wait(10)")
    release, seen = threading.Event(), []
    hook = threading.Thread(target=collective, args=(release,))

    def sample():
        time.sleep(0.3)
        seen.append(rank_stack())
        release.set()

    hook.start()
    threading.Thread(target=sample).start()
    engine(release)
    hook.join()
    functions = [f.function for f in seen[0]]
    assert functions.index("_engine_run_backward") < functions.index("reduce_scatter_single")
    assert describe(seen[0]).collective == "reduce_scatter_single"


def test_a_zero_step_is_counted_once():
    """ZeroRedundancyOptimizer.step is an Optimizer step that steps its inner optimizer:
    the global hook sees both, and only the inner one counts (review finding)."""
    from types import SimpleNamespace

    from phalanx.hang.watchdog import Watchdog

    class ZeroRedundancyOptimizer:  # the name is what the hook tells apart
        pass

    class AdamW:
        pass

    dog = SimpleNamespace(beat_state=SimpleNamespace(optimizer_steps=0))
    Watchdog.count_optimizer_step(dog, ZeroRedundancyOptimizer(), (), {})  # type: ignore[arg-type]
    Watchdog.count_optimizer_step(dog, AdamW(), (), {})  # type: ignore[arg-type]
    assert dog.beat_state.optimizer_steps == 1


def test_collectives_issued_far_ahead_of_a_peer_are_not_progress():
    """A rank whose default-group collectives keep moving is progressing (a slow healthy
    loop), unless it is more than AHEAD of another rank's (async ones never waited for):
    then only its stack and beats count."""
    from phalanx.hang.watchdog import AHEAD, Watchdog

    dog = Watchdog(None, 0, 2, timeout=4.0)
    stuck = {"seq": 1, "idle": 9.0, "idle_moved": 9.0, "issued": 7}
    near = {"seq": 1, "idle": 0.2, "idle_moved": 9.0, "issued": 8}
    far = {**near, "issued": 7 + AHEAD + 1}
    assert dog._idle({0: stuck, 1: near})[1] < 1.0
    assert dog._idle({0: stuck, 1: far})[1] >= 9.0
    old = {"seq": 1, "idle": 0.2, "idle_moved": 9.0}  # (a heartbeat without the count)
    assert dog._idle({0: stuck, 1: old})[1] < 1.0
