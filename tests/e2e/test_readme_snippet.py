"""The README's own-script snippet, as written: an exception on one rank ends the job
within seconds on every rank (no barrier at exit after an error), and the exception is
shown — under torchrun and under `phalanx run` (under srun: tests/e2e/test_slurm.py);
and the README's `phalanx run` command, run as shown, trains and then resumes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from readme_snippet import failing_script, working_script  # noqa: E402


@pytest.mark.parametrize("launcher", ["torchrun", "phalanx run"])
def test_an_exception_on_one_rank_ends_the_job_within_seconds(tmp_path, launcher):
    script = failing_script(tmp_path)
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone"]
           if launcher == "torchrun" else
           [sys.executable, "-m", "phalanx", "run", "--out", str(tmp_path / "out")])
    begun = time.monotonic()
    proc = subprocess.run([*cmd, "--nproc-per-node", "2", str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - begun
    assert proc.returncode != 0
    assert took < 25, f"took {took:.0f} s"  # start-up included; hung: 120 s and more
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
