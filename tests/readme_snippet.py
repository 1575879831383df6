"""The README's own-script snippet made runnable: a tiny model and dataset around it, and
a `loss_fn` that raises on rank 0 at the 10th micro-step (optimizer step 3)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"

HARNESS = '''
import torch.nn as nn
from torch.utils.data import TensorDataset
model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 1))
dataset = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
calls = 0
def loss_fn(out, y):
    global calls
    calls += 1
    if calls == 10 and run.rank == 0:
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
    head, rest = snippet().split("\n", 1)
    path = folder / "train.py"
    path.write_text(head + "\n" + HARNESS + rest)
    return path
