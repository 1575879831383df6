"""The NaN guard on 2 gloo ranks: a NaN planted in one rank's loss is seen by both ranks
at the same step, the step is skipped everywhere (replicas stay bitwise equal: checked
every step), the message names the rank; `--on-nan rollback` reloads the last checkpoint
and ends with finite weights; `--on-nan stop` ends there; a diverging run never commits a
non-finite checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "4", "--sample-tokens", "0", "--nproc-per-node", "2",
        "--resume", "never", "--eval-every", "100"]
NAN_AT_4 = {"PHALANX_FAULT": "rank=1,step=3,phase=step,action=nan"}  # after step 3: step 4


def train(tmp_path, name: str, *extra: str, env: dict | None = None, data=()):
    done = subprocess.run([sys.executable, "-m", "phalanx", "train", *ARGS, *data, *extra,
                           "--out", str(tmp_path / name)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})
    return done, done.stdout + done.stderr


def export(tmp_path, run: str, step: int) -> dict:
    target = tmp_path / f"{run}-{step}" / "model.safetensors"  # config.json beside it
    target.parent.mkdir()
    done = subprocess.run([sys.executable, "-m", "phalanx", "export", "--out", str(target),
                           str(tmp_path / run / "checkpoints" / f"step-{step:08d}")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return load_file(str(target))


def test_a_nan_on_one_rank_skips_the_step_on_every_rank(tmp_path, small_corpus_file,
                                                          cache_dir):
    data = ("--data", str(small_corpus_file), "--cache-dir", str(cache_dir))
    done, said = train(tmp_path, "skip", "--max-steps", "6", "--checkpoint-every", "1",
                       "--keep-checkpoints", "10", "--check-consistency-every", "1",
                       env=NAN_AT_4, data=data)
    assert done.returncode == 0, said[-2000:]
    assert said.count("step 4: the loss of rank 1 is not finite") == 1, said[-2000:]
    assert "step skipped on every rank (1 so far; --on-nan skip)" in said
    before, at, after = (export(tmp_path, "skip", s) for s in (3, 4, 5))
    assert all(torch.equal(before[k], at[k]) for k in before)  # step 4 changed nothing
    assert not all(torch.equal(at[k], after[k]) for k in at)  # step 5 trained again
    final = load_file(str(tmp_path / "skip" / "model.safetensors"))
    assert all(bool(torch.isfinite(v).all()) for v in final.values())


def test_on_nan_stop_ends_the_run_in_one_line(tmp_path, small_corpus_file, cache_dir):
    data = ("--data", str(small_corpus_file), "--cache-dir", str(cache_dir))
    done, said = train(tmp_path, "stop", "--max-steps", "6", "--on-nan", "stop",
                       env=NAN_AT_4, data=data)
    assert done.returncode == 2, said[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("phalanx: error: [rank 0] step 4: the loss of rank 1 is not "
                           "finite") and "stopped (--on-nan stop)" in last, last
    assert last.endswith(".") and not last.endswith(".."), last
    assert "Traceback" not in done.stderr


def test_a_diverging_run_commits_no_non_finite_checkpoint(tmp_path, small_corpus_file,
                                                          cache_dir):
    data = ("--data", str(small_corpus_file), "--cache-dir", str(cache_dir))
    done, said = train(tmp_path, "lr50", "--max-steps", "40", "--lr", "50", "--grad-clip",
                       "0", "--warmup-steps", "1", "--checkpoint-every", "1",
                       "--keep-checkpoints", "3", data=data)
    assert done.returncode == 2, said[-2000:]
    assert "the run diverged" in done.stderr.strip().splitlines()[-1]
    committed = sorted((tmp_path / "lr50" / "checkpoints").glob("step-*"))
    for path in committed:
        weights = export(tmp_path, "lr50", int(path.name.split("-")[1]))
        assert all(bool(torch.isfinite(v).all()) for v in weights.values()), path.name
    assert not (tmp_path / "lr50" / "model.safetensors").exists()


def test_rollback_reloads_the_checkpoint_and_goes_past_the_batch(tmp_path, small_corpus_file,
                                                                 cache_dir):
    data = ("--data", str(small_corpus_file), "--cache-dir", str(cache_dir))
    nan_at_5 = {"PHALANX_FAULT": "rank=1,step=4,phase=step,action=nan"}
    done, said = train(tmp_path, "rollback", "--max-steps", "8", "--checkpoint-every", "3",
                       "--on-nan", "rollback", "--check-consistency-every", "1",
                       "--log-every", "1", env=nan_at_5, data=data)
    assert done.returncode == 0, said[-2000:]
    assert "step 5: the loss of rank 1 is not finite" in said
    assert said.count("rolled back to the checkpoint of step 3") == 1, said[-2000:]
    final = load_file(str(tmp_path / "rollback" / "model.safetensors"))
    assert all(bool(torch.isfinite(v).all()) for v in final.values())
    out = tmp_path / "rollback"
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["step"]) for e in events] == [  # (the injection is recorded:
        ("fault", 0), ("nan", 5), ("rollback", 3), ("goodput", 8)]  # issue 41.6; goodput
    # at the end, issue 45: the steps trained again after the rollback are lost time
    assert "recomputed steps" in events[-1]["message"] and "(2 segments)" in \
        events[-1]["message"]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text()
             .splitlines()]
    assert steps == list(range(1, 9))  # steps 4.. were trained again, each logged once


def test_rollback_stops_when_the_same_checkpoint_keeps_failing(tmp_path, small_corpus_file,
                                                               cache_dir):
    data = ("--data", str(small_corpus_file), "--cache-dir", str(cache_dir))
    always = {"PHALANX_FAULT": "rank=0,step=4,phase=step,action=nan,times=9"}
    done, said = train(tmp_path, "again", "--max-steps", "8", "--checkpoint-every", "3",
                       "--on-nan", "rollback", env=always, data=data)
    assert done.returncode == 2, said[-2000:]
    assert said.count("rolled back to the checkpoint of step 3") == 3
    last = done.stderr.strip().splitlines()[-1]
    assert "3 rollbacks to the checkpoint of step 3 did not get the run past it" in last, last
    assert last.endswith(".") and not last.endswith(".."), last


def test_after_a_rollback_the_data_cursor_counts_the_failed_batch(tmp_path, small_corpus_file,
                                                                   cache_dir):
    """Steps 1-5 read 5 global batches (the 5th failed), then steps 4-8 read 5 more: the
    cursor committed at step 8 is 10 global batches, so a resume from it reads on from
    where the stream is, not one batch back (the failed one, again)."""
    data = ("--data", str(small_corpus_file), "--cache-dir", str(cache_dir))
    nan_at_5 = {"PHALANX_FAULT": "rank=1,step=4,phase=step,action=nan"}
    done, said = train(tmp_path, "cursor", "--max-steps", "8", "--checkpoint-every", "3",
                       "--on-nan", "rollback", env=nan_at_5, data=data)
    assert done.returncode == 0, said[-2000:]
    assert said.count("rolled back to the checkpoint of step 3") == 1, said[-2000:]
    sidecar = tmp_path / "cursor" / "checkpoints" / "step-00000008" / "train_state.json"
    state = json.loads(sidecar.read_text())["meta"]["train_state"]
    global_batch = 4 * 1 * 2  # --micro-batch-size 4, no accumulation, 2 ranks
    assert state["position"] == 10 * global_batch, state
