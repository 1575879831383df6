"""A rank slowed from step 10 — in its data loading, forward, optimizer step or between
steps, under ddp, fsdp and zero — is named as a straggler within 15 steps, by
`phalanx train` and in a user's script under `phalanx run`; no rank is named before it
slows (2 gloo ranks; runtime.pace)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from test_fault_tolerance import train

SLOWED_AT, STEPS = 10, 30
NAMED = re.compile(r"phalanx: warning: step (\d+): rank (\d+) on \S+ is a straggler: its own "
                   r"time \(the step minus its waits in collectives\) is ([\d.]+) ms per step, "
                   r"[\d.]+× the median of the other ranks \([\d.]+ ms; ([\d.]+)× the fastest")


def _named(stdout: str) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for m in NAMED.finditer(stdout)]


def _to_fastest(stdout: str) -> list[float]:
    return [float(m[4]) for m in NAMED.finditer(stdout)]


@pytest.mark.parametrize("strategy,where", [("ddp", "data"), ("ddp", "optimizer"),
                                            ("fsdp", "forward"), ("zero", "between")])
def test_a_rank_slowed_anywhere_in_the_step_is_named(strategy, where, tmp_path,
                                                     small_corpus_file, cache_dir):
    # 60 ms a step: over 3× this tiny model's step on 2 shared cores (~15-25 ms)
    fault = f"rank=1,step={SLOWED_AT},action=slow,where={where},ms=60"
    proc = train(tmp_path, small_corpus_file, cache_dir, fault, "--max-steps", str(STEPS),
                 "--checkpoint-every", "30", "--eval-every", "30", "--strategy", strategy)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [(step, rank)] = _named(proc.stdout)
    # named after the slowdown and before the run ends: at 2 checks of 5 steps in a row,
    # step 20 on a quiet machine; under load a window can miss the 2x factor (a CI run
    # named it at step 30, at 4.7x)
    assert rank == 1 and SLOWED_AT < step <= STEPS, proc.stdout
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert ("straggler", step) in [(e["kind"], e["step"]) for e in events]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # named at a check where its own time was over 2x the other rank's (runtime.pace)
    assert _to_fastest(proc.stdout)[0] >= 2.0, proc.stdout
    # the last window's figures: still the slowest. Not "> 2x" there: on a loaded machine
    # the fast rank's own time grows too (one CI run read 1.86x at step 30)
    last = records[-1]
    assert last["slowest_rank"] == 1 and last["slowest_to_fastest"] > 1.2, last
    assert last["slowest_to_own_best"] > 2, last  # against its own history too


SCRIPT = """
import sys, time
import torch
import phalanx

run = phalanx.init(seed=0)
model, opt = run.setup(torch.nn.Linear(64, 64),
                       lambda params: torch.optim.SGD(params, lr=0.01))
acc = run.accumulate(model, 2)
for step in range(1, 31):
    for _ in range(2):
        with acc.micro_step():
            acc.backward(model(torch.randn(32, 64)).square().mean())
    if run.rank == 1 and step > 10:
        time.sleep(0.03)  # this rank's own work, slower from step 11
    run.step(opt)
print("trained", run.rank)
"""


def test_a_slow_rank_in_a_users_script_is_named(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "phalanx", "run", "--nproc-per-node", "2",
                           "--threads-per-rank", "1", "--tee-ranks", "--out",
                           str(tmp_path / "out"), str(script)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [(step, rank)] = _named(proc.stdout + proc.stderr)
    assert rank == 1 and SLOWED_AT < step <= SLOWED_AT + 15, proc.stdout
    events = (tmp_path / "out" / "events.jsonl").read_text()
    assert '"kind": "straggler"' in events
