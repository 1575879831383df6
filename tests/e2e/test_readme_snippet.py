"""The README's own-script snippet, as written: an exception on one rank ends the job
within seconds on every rank (no barrier at exit after an error), and the exception is
shown — under torchrun and under `phalanx run`."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"

HARNESS = '''
import torch, torch.nn as nn
from torch.utils.data import TensorDataset
import os
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
dataset = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
calls = 0
def loss_fn(out, y):
    global calls
    calls += 1
    if calls == 10 and os.environ.get("RANK", "0") == "0":
        raise ValueError("bad batch at step 3")
    return nn.functional.mse_loss(out, y)
local_val_loss = 0.0
'''


def readme_snippet() -> str:
    section = README.read_text().split("## Your own script", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    return code.group(1)


@pytest.fixture
def script(tmp_path) -> Path:
    snippet = readme_snippet()
    head, rest = snippet.split("\n", 1)  # `import phalanx, torch` first
    path = tmp_path / "train.py"
    path.write_text(head + "\n" + HARNESS + rest)
    return path


@pytest.mark.parametrize("launcher", ["torchrun", "phalanx run"])
def test_an_exception_on_one_rank_ends_the_job_within_seconds(script, tmp_path, launcher):
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
