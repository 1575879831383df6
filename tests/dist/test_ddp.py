"""The correctness claims, proven with 2 gloo ranks on CPU.

One launch (torch's elastic agent, as for users) runs every scenario in one process
group; the single-process references run in this test process at world size 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.data.corpus import prepare
from phalanx.train.loop import train

sys.path.insert(0, str(Path(__file__).parent))
from common import sgd_trajectory  # noqa: E402
from scenarios import config  # noqa: E402

# fp32 on CPU: the same samples summed in a different order (2 ranks vs 1) differ by
# float rounding only; after 3 AdamW steps the largest weight difference seen is ~1e-7.
TOL = dict(rtol=1e-4, atol=1e-5)


def load(out: Path, name: str, rank: int) -> dict:
    return torch.load(out / f"{name}-rank{rank}.pt", weights_only=True)


def single_process(corpus_file, cache_dir, micro_batch: int, accum: int, steps: int) -> dict:
    splits = prepare(str(corpus_file), str(cache_dir), 0.1)
    with phalanx.init(seed=7, threads=1) as run:
        assert run.world_size == 1
        result = train(config(micro_batch, accum, steps, strategy="single"), run, splits)
        return {"state": run.unwrap(result.model).state_dict(), "losses": result.losses}


def assert_states_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], **TOL), (
            key, (a[key] - b[key]).abs().max().item())


def test_replicas_stay_bitwise_identical(results):
    for name in ("ddp-b2-k1", "ddp-b2-k2", "ddp-long"):
        r0, r1 = load(results, name, 0), load(results, name, 1)
        for key in r0["state"]:
            assert torch.equal(r0["state"][key], r1["state"][key]), (name, key)
        assert r0["losses"] == r1["losses"]


def test_ddp_equals_one_process_on_the_same_global_batch(results, corpus_file, cache_dir):
    reference = single_process(corpus_file, cache_dir, micro_batch=4, accum=1, steps=3)
    ddp = load(results, "ddp-b2-k1", 0)
    assert_states_close(ddp["state"], reference["state"])
    assert ddp["losses"] == pytest.approx(reference["losses"], rel=1e-5)


def test_accumulation_equals_a_large_batch_with_ddp(results, corpus_file, cache_dir):
    reference = single_process(corpus_file, cache_dir, micro_batch=8, accum=1, steps=3)
    assert_states_close(load(results, "ddp-b2-k2", 0)["state"], reference["state"])


def test_accumulation_equals_a_large_batch_without_ddp(corpus_file, cache_dir):
    accumulated = single_process(corpus_file, cache_dir, micro_batch=2, accum=4, steps=3)
    reference = single_process(corpus_file, cache_dir, micro_batch=8, accum=1, steps=3)
    assert_states_close(accumulated["state"], reference["state"])
    assert accumulated["losses"] == pytest.approx(reference["losses"], rel=1e-5)


def sgd_single(corpus_file, cache_dir, micro_batch: int, accum: int) -> dict:
    splits = prepare(str(corpus_file), str(cache_dir), 0.1)
    with phalanx.init(seed=7, threads=1) as run:
        return sgd_trajectory(run, splits.load("train"), micro_batch, accum, steps=3)


def assert_grads_close(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for step, (ga, gb) in enumerate(zip(a, b)):
        for name in ga:
            assert torch.allclose(ga[name], gb[name], **TOL), (step, name)


@pytest.mark.parametrize("micro, accum", [(4, 1), (2, 2)])
def test_ddp_gradients_equal_the_large_batch_gradients(results, corpus_file, cache_dir,
                                                       micro, accum):
    """2 ranks × micro × accum vs 1 process × 8: the averaged gradient at every step."""
    reference = sgd_single(corpus_file, cache_dir, 8, 1)
    for rank in (0, 1):
        ddp = torch.load(results / f"sgd-b{micro}-k{accum}-rank{rank}.pt", weights_only=True)
        assert_grads_close(ddp["grads"], reference["grads"])
        assert_states_close(ddp["state"], reference["state"])


def test_accumulation_gradients_equal_the_large_batch_without_ddp(corpus_file, cache_dir):
    assert_grads_close(sgd_single(corpus_file, cache_dir, 2, 4)["grads"],
                       sgd_single(corpus_file, cache_dir, 8, 1)["grads"])


def test_micro_steps_before_the_last_do_not_synchronise(results):
    """no_sync is in effect: after the first micro-step, ranks hold different gradients.

    Except in the very first window: with static_graph (the trainer's default) torch
    cannot skip sync before one synchronised iteration, so Phalanx syncs it (same result).
    """
    r0 = torch.load(results / "sgd-b2-k2-rank0.pt", weights_only=True)["first_micro_grads"]
    r1 = torch.load(results / "sgd-b2-k2-rank1.pt", weights_only=True)["first_micro_grads"]
    assert len(r0) == 3
    assert torch.equal(r0[0], r1[0])
    assert all(not torch.equal(a, b) for a, b in zip(r0[1:], r1[1:]))


def test_loss_decreases(results):
    losses = load(results, "ddp-long", 0)["losses"]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_unused_parameter_error_names_the_parameters(results):
    for rank in (0, 1):
        message = (results / f"unused-rank{rank}.txt").read_text()
        assert "unused.weight, unused.bias" in message, message
        assert f"[rank {rank}]" in message


def test_all_reduce_mean(results):
    for rank in (0, 1):
        assert float((results / f"mean-rank{rank}.txt").read_text()) == 1.5


def test_agree_gives_every_rank_the_same_reduced_number(results):
    """max/min/sum of rank + 1 over 2 ranks, and a bool tensor true on rank 0 only."""
    for rank in (0, 1):
        assert (results / f"agree-rank{rank}.txt").read_text() == repr([2.0, 1.0, 3.0, 0.0])


def test_run_log_reduces_over_ranks_and_rank_0_writes(results):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = results / "run-log"
    records = [json.loads(line) for line in (logged / "metrics.jsonl").read_text().splitlines()]
    measured = ("memory_mib", "step_time_s")  # what the sink adds (issue 40.13)
    assert [{k: v for k, v in r.items() if k not in measured} for r in records] == [
        {"step": 1, "x": 3.0, "y": 1.0}, {"step": 2, "x": 10.0}, {"step": 3, "x": 5.0}]
    assert all(r["memory_mib"] > 0 for r in records)
    assert "step_time_s" not in records[0] and all(r["step_time_s"] >= 0 for r in records[1:])
    [events] = list((logged / "tb").glob("events.out.tfevents.*"))  # one writer: rank 0
    tb = EventAccumulator(str(logged / "tb"))
    tb.Reload()
    assert [(e.step, e.value) for e in tb.Scalars("train/x")] == [(1, 3.0), (2, 10.0),
                                                                  (3, 5.0)]


def test_a_checkpoint_directory_rank_0_cannot_make_fails_on_every_rank_alike(results):
    first, second = ((results / f"unwritable-rank{r}.txt").read_text().splitlines()
                     for r in (0, 1))
    assert first == second, (first, second)
    assert first[0].startswith("cannot create checkpoint directory `"), first
    assert first[0].endswith("Not a directory. The previous checkpoints in "
                             f"`{results / 'a-file' / 'checkpoints'}` are intact; free space "
                             "or choose a writable `--out`."), first
    assert first[1] == "step-00000002"  # the next save, on every rank: still in step
