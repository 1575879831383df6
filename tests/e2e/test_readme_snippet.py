"""The README's own-script snippet, as written: an exception on one rank ends the job
within seconds on every rank (no barrier at exit after an error), and the exception is
shown — under torchrun and under `phalanx run` (under srun: tests/e2e/test_slurm.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from readme_snippet import failing_script  # noqa: E402


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
    assert took < 40, f"took {took:.0f} s"
    output = proc.stdout + proc.stderr
    assert "ValueError: bad batch at step 3" in output, output[-3000:]
