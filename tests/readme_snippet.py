"""The README's own-script snippet made runnable: a tiny model and dataset around it, and
a `loss_fn` that raises on rank 0 at the 10th micro-step (optimizer step 3), or never."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"

HARNESS = '''
import torch.nn as nn
from torch.utils.data import TensorDataset
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
dataset = TensorDataset(torch.randn(SAMPLES, 4), torch.randn(SAMPLES, 1))
calls = 0
def loss_fn(out, y):
    global calls
    calls += 1
    if calls == FAIL_AT and run.rank == 0:
        raise ValueError("bad batch at step 3")
    return nn.functional.mse_loss(out, y)
local_val_loss = 0.0
'''


def snippet() -> str:
    section = README.read_text().split("## Your own script", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the README's own-script section has no python block"
    return code.group(1)


def failing_script(folder: Path) -> Path:
    """The snippet as written, its first line (the imports) first, then the harness."""
    return _script(folder, samples=256, fail_at=10)


def working_script(folder: Path) -> Path:
    """The snippet with 3 epochs of 60 steps: one save, at step 100, mid-epoch 2."""
    return _script(folder, samples=60 * 4 * 16 * 2, fail_at=-1)


def _script(folder: Path, samples: int, fail_at: int) -> Path:
    head, rest = snippet().split("\n", 1)
    path = folder / "train.py"
    harness = HARNESS.replace("SAMPLES", str(samples)).replace("FAIL_AT", str(fail_at))
    path.write_text(head + "\n" + harness + rest)
    return path
