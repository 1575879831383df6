"""Ctrl-C / SIGTERM at random moments (issue 25, item 1): each stop exits 130/143 (0 when
the signal came after the last step: always so for the final export, and accepted only
there and for a signal rank 0 received with fewer than 2 steps left — the step it was
received after is what rank 0 says at once, "SIGINT received after step N of 24"; one
received earlier exits 130/143, writes no model.safetensors and commits no checkpoint past
step N + 1), prints no traceback, leaves no process, every checkpoint committed when it
was sent still verifies (unless rotation removed it after KEEP newer ones), and the
resumed run ends bit-identical to one that was never interrupted.

One stop per moment (8); CI runs the five whose path no other test takes (start-up,
mid-step, the async checkpoint, the final export, a restart) and marks the other three
`full` (PHALANX_FULL=1 runs them). Any number on demand, every one run:
`PHALANX_STOP_STRESS=100 python -m pytest -q tests/e2e/test_stop_stress.py`
(`PHALANX_STOP_STRESS_SEED` picks other moments)."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file

import procs
from stop_stress import KEEP, STEPS, checkpoints, command, plan, step_of, stop_once

STOP_WORDS = ("stopped by SIG", "phalanx: interrupted", "came after the last step")
ASKED = os.environ.get("PHALANX_STOP_STRESS")  # a number asked for: every stop runs
CASES = plan(int(ASKED or "8"), int(os.environ.get("PHALANX_STOP_STRESS_SEED", "0")))
# (the first signal's checkpoint: tests/e2e/test_signals.py; a stop at the first step or
# in an evaluation takes mid-step's path, as rank 0's step loop sees it)
SAMPLED = {"start-up", "mid-step", "checkpoint (async)", "final export", "restart"}
PARAMS = [case if ASKED or case.moment in SAMPLED else pytest.param(case, marks=pytest.mark.full)
          for case in CASES]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, small_corpus_file, cache_dir):
    out = tmp_path_factory.mktemp("straight") / "run"
    done = subprocess.run(command(out, small_corpus_file, cache_dir), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return load_file(out / "model.safetensors")


@pytest.mark.parametrize("case", PARAMS, ids=[f"{i:03d}-{c.moment}-{c.sig.name}"
                                             for i, c in enumerate(CASES)])
def test_a_stop_at_any_moment(case, tmp_path, straight, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    stopped = stop_once(case, out, small_corpus_file, cache_dir)
    console = stopped.stdout + stopped.stderr
    assert stopped.sent, f"the moment ({case.trigger!r}) never came:\n{console}"
    assert "Traceback" not in console, console
    received = stopped.received  # the steps rank 0 had done when the signal arrived
    complete = "came after the last step" in console  # the signal lost the race to the end
    if received is None:  # rank 0 never got it: the launcher ended first (or a restart)
        assert complete or stopped.code != 0, console
    left = STEPS - (stopped.last_step if received is None else received)
    assert not complete or case.moment == "final export" or left < 2, (left, console)
    expected = 0 if case.moment == "final export" or complete else 128 + case.sig
    assert stopped.code == expected, (left, console)
    if complete:
        assert (out / "report.html").is_file() and (out / "model.safetensors").is_file()
    elif received is not None:  # stopped after the step in progress, not later
        assert not (out / "model.safetensors").exists(), (received, console)
        newest = max(map(step_of, checkpoints(out)), default=0)
        assert newest <= received + 1 and newest < STEPS, (received, newest, console)
    said = [line for line in stopped.stderr.splitlines() + stopped.stdout.splitlines()
            if line.startswith("phalanx: ") and any(w in line for w in STOP_WORDS)]
    assert len(said) == 1, console  # one line says how it ended
    assert procs.gone_within(stopped.workers, 10), f"left running: {procs.alive(stopped.workers)}"
    _nothing_lost(stopped.before, checkpoints(out))
    resumed = subprocess.run(command(out, small_corpus_file, cache_dir), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stdout + resumed.stderr
    weights = load_file(out / "model.safetensors")
    assert weights.keys() == straight.keys()
    assert all(torch.equal(weights[k], straight[k]) for k in weights), "not bit-identical"


def _nothing_lost(before: dict[str, bool], after: dict[str, bool]) -> None:
    """Every checkpoint committed (and valid) when the signal was sent still verifies,
    unless the rotation rule removed it: KEEP newer ones committed since."""
    assert all(after.values()), after
    for name, valid in before.items():
        assert valid, (name, before)
        newer = [n for n in after if step_of(n) > step_of(name)]
        assert name in after or len(newer) >= KEEP, (name, before, after)


def test_a_complete_run_missing_its_outputs_writes_them_again(tmp_path, straight,
                                                              small_corpus_file, cache_dir):
    """A run cut short while it wrote its outputs (a second signal, a SIGKILL) answered
    'already complete … nothing written' on resume, so they never appeared."""
    out = tmp_path / "run"
    first = subprocess.run(command(out, small_corpus_file, cache_dir), capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    for name in ("report.html", "loss.png", "model.safetensors"):
        (out / name).unlink()
    again = subprocess.run(command(out, small_corpus_file, cache_dir), capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "is complete but model.safetensors, loss.png, report.html are missing" in again.stdout
    assert (out / "report.html").is_file() and (out / "loss.png").is_file()
    weights = load_file(out / "model.safetensors")
    assert all(torch.equal(weights[k], straight[k]) for k in straight)
    third = subprocess.run(command(out, small_corpus_file, cache_dir), capture_output=True,
                           text=True, timeout=300)
    assert third.returncode == 0 and "already complete" in third.stdout, third.stdout
