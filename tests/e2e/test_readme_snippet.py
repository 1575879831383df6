"""The README's own-script snippet, as written: an exception on one rank ends the job
within seconds on every rank (no barrier at exit after an error), and the exception is
shown — under torchrun and under `phalanx run` (under srun: tests/e2e/test_slurm.py);
and the README's `phalanx run` command, run as shown, trains and then resumes; in fp16,
cut after its commit and resumed in a new process, it ends bitwise equal to a run that
was never cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from readme_snippet import (  # noqa: E402
    failing_script,
    resumable_script,
    seconds_since_the_raise,
    working_script,
)


@pytest.mark.parametrize("launcher", ["torchrun", "phalanx run"])
def test_an_exception_on_one_rank_ends_the_job_within_seconds(tmp_path, launcher):
    script = failing_script(tmp_path)
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone"]
           if launcher == "torchrun" else
           [sys.executable, "-m", "phalanx", "run", "--out", str(tmp_path / "out")])
    proc = subprocess.run([*cmd, "--nproc-per-node", "2", str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    took = seconds_since_the_raise(tmp_path)
    assert proc.returncode != 0
    assert took < 10, f"ended {took:.1f} s after the raise"  # a barrier at exit: 120 s
    output = proc.stdout + proc.stderr
    assert "ValueError: bad batch at step 3" in output, output[-3000:]


def test_the_readme_command_runs_the_snippet_and_resumes_it(tmp_path):
    working_script(tmp_path)
    cmd = [sys.executable, "-m", "phalanx", "run", "--nproc-per-node", "2", "--out",
           "runs/mine", "train.py", "--lr", "3e-4"]  # the README's line
    first = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("val ") == 3  # rank 0 prints once an epoch
    ckpt = tmp_path / "runs/mine/checkpoints"
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000100"]
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {ckpt.resolve()}/step-00000100 (step 100)" in again.stdout
    assert again.stdout.count("val ") == 2  # epochs 2 (step 100 is in it) and 3


def test_the_readme_snippet_cut_and_resumed_in_fp16_ends_bitwise_equal(tmp_path):
    """Issue 41.4: the snippet itself, its loss scale moved before the commit (so a
    resume that lost the scaler's state would differ), cut right after step 100 and
    resumed by a new process, against one never cut."""
    runs = {}
    for name in ("cut", "straight"):
        folder = tmp_path / name
        folder.mkdir()
        resumable_script(folder)
        cmd = [sys.executable, "-m", "phalanx", "run", "--nproc-per-node", "2", "--out",
               "runs/mine", "train.py"]
        if name == "cut":
            cut = subprocess.run(cmd, cwd=folder, capture_output=True, text=True,
                                 timeout=300, env={**os.environ, "PHALANX_TEST_CUT": "1"})
            assert cut.returncode != 0 and not (folder / "final.pt").exists(), cut.stdout
            step100 = folder / "runs/mine/checkpoints/step-00000100"
            scale = _saved_scale(step100)
            assert scale not in (2.0 ** 16, 2.0 ** 10), scale  # it moved before the commit
        done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        if name == "cut":
            assert "(step 100)" in done.stdout, done.stdout
        runs[name] = torch.load(folder / "final.pt")
    cut, straight = runs["cut"], runs["straight"]
    assert cut.keys() == straight.keys()
    assert all(torch.equal(cut[k], straight[k]) for k in cut), "not bitwise equal"


def _saved_scale(checkpoint: Path) -> float:
    """The loss scale a checkpoint committed (its JSON sidecar's `phalanx.scaler`)."""
    for path in sorted(checkpoint.rglob("*.json")):
        found = _find(json.loads(path.read_text()), "phalanx.scaler")
        if found is not None:
            return float(found["scale"])
    raise AssertionError(f"no loss scaler's state in {checkpoint}")


def _find(value, key: str):
    if isinstance(value, dict):
        if key in value:
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found = _find(item, key)
            if found is not None:
                return found
    return None
