"""The README's own-script snippet made runnable: a tiny model and dataset around it, and
a `loss_fn` that raises on rank 0 at the 10th micro-step (optimizer step 3), or never;
or (`resumable_script`) the snippet in fp16 with a loss scaler that falls and grows, cut
right after its commit at step 100, writing its final weights."""

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
        import time  # the moment of the raise, for the tests that time the job's end
        open("raised-at", "w").write(repr(time.time()))
        raise ValueError("bad batch at step 3")
    return nn.functional.mse_loss(out, y)
local_val_loss = 0.0
'''


def seconds_since_the_raise(folder: Path) -> float:
    """Seconds from rank 0's raise (the harness writes its wall time) to now: the time
    the job took to end, without the start-up, which a loaded machine stretches."""
    import time
    return time.time() - float((folder / "raised-at").read_text())


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


# fp16: the scale falls (an infinite loss at step 1) and grows (×4 every 2 steps without
# overflow) long before the commit at step 100, so a resume that dropped the scaler's
# state would differ; torch's default (2**16, ×2 after 2,000 steps) never moves here
RESUMABLE = '''
import os
SCALER = {"scale": 2.0 ** 10, "growth_factor": 4.0, "backoff_factor": 0.5,
          "growth_interval": 2, "_growth_tracker": 0}
def loss_fn(out, y):
    global calls
    calls += 1
    if calls == 1 and step == 0:  # a fresh start (a resume restores the scaler instead)
        run.precision.scaler.load_state_dict(SCALER)
    if os.environ.get("PHALANX_TEST_CUT") and step == 100:  # step 100 is committed
        raise SystemExit(3)
    loss = nn.functional.mse_loss(out, y)
    return loss * float("inf") if step == 0 and calls == 2 else loss  # step 1 overflows
'''
FINAL = '''state = run.full_state_dict(model)
if run.is_main:
    torch.save(state, "final.pt")
run.close()'''


def resumable_script(folder: Path) -> Path:
    """`working_script`'s snippet in fp16 (`precision="fp16"` for the README's "bf16"),
    its scaler made to move, cut (exit 3) right after the commit at step 100 when
    PHALANX_TEST_CUT is set, saving the final weights to final.pt (rank 0)."""
    path = working_script(folder)
    text = path.read_text()
    assert text.count('precision="bf16"') == 1 and text.count("run.close()") == 1, text
    text = text.replace('precision="bf16"', 'precision="fp16"')
    text = text.replace("run.close()", FINAL)
    head, rest = text.split("\nrun = phalanx.init(", 1)  # the harness, then the snippet
    path.write_text(head + RESUMABLE + "\nrun = phalanx.init(" + rest)
    return path
