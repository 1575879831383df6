"""Issue 47: each error rule beside PX301 (tests/unit/test_lint_proof.py) with what it
proves and one step outside it — the false errors a review found (2026-11-29) are silent
now, and the case the rule is for is still an error. docs/lint.md, "What each error
proves", says what each one establishes and assumes."""

from __future__ import annotations

import pytest

from phalanx.lint.engine import lint_source
from phalanx.lint.rules import BY_CODE


def errors(code: str, source: str) -> list[int]:
    return [f.line for f in lint_source("t.py", source, [BY_CODE[code]])
            if f.severity == "error"]


CASES = [
    # PX102: a `model` of a function defined at the top level is another variable
    ("PX102", "import torch\nmodel = Net()\nmodel = DDP(model)  # cuda\nmodel.to('cuda')\n",
     "import torch\nmodel = build_model(cfg)\nmodel = DDP(model)  # cuda\n"
     "def evaluate(model):\n    model.to('cpu')\n", 3),
    # PX106: an optimizer a helper builds later, or one rebuilt after the wrap
    ("PX106", "import torch\nopt = torch.optim.AdamW(model.parameters())\nmodel = FSDP(model)\n",
     "import torch\ndef make_opt(model):\n    return torch.optim.AdamW(model.parameters())\n"
     "model = FSDP(model)\nopt = make_opt(model)\n", 2),
    ("PX106", "import torch\nopt = torch.optim.AdamW(model.parameters())\nmodel = FSDP(model)\n",
     "import torch\nopt = torch.optim.AdamW(model.parameters())\nmodel = FSDP(model)\n"
     "opt = torch.optim.AdamW(model.parameters())\n", 2),
    # PX107: another function's `model`
    ("PX107", "import torch\nmodel = FSDP(net)\n"
     "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
     "import torch\ndef setup(net):\n    model = FSDP(net)\n    return model\n"
     "def train_ddp(model):\n    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n", 3),
    # PX505: another function's `opt`
    ("PX505", "import torch\nopt = ZeroRedundancyOptimizer(params, torch.optim.AdamW)\n"
     "torch.save(opt.state_dict(), 'o.pt')\n",
     "import torch\ndef a(params):\n    opt = ZeroRedundancyOptimizer(params, torch.optim.AdamW)\n"
     "    return opt\ndef b(params):\n    opt = torch.optim.AdamW(params)\n"
     "    torch.save(opt.state_dict(), 'o.pt')\n", 3),
    # PX202: `sampler=None` is accepted; `batch_sampler=` with shuffle raises too
    ("PX202", "loader = DataLoader(ds, batch_sampler=bs, shuffle=True)\n",
     "loader = DataLoader(ds, sampler=None, shuffle=True)\n", 1),
    # PX402: the flag set from a parameter its callers compute on every micro-step
    ("PX402", "model.require_backward_grad_sync = False\n",
     "def set_sync(model, sync):\n    model.require_backward_grad_sync = sync\n"
     "for i in range(accum):\n    set_sync(model, i == accum - 1)\n    loss.backward()\n", 1),
    # PX601: `scaler.step` has unscaled the gradients (clipping after it is late, not scaled)
    ("PX601", "import torch\nscaler = torch.amp.GradScaler()\nscaler.scale(loss).backward()\n"
     "clip_grad_norm_(model.parameters(), 1.0)\nscaler.step(opt)\n",
     "import torch\nscaler = torch.amp.GradScaler()\nscaler.scale(loss).backward()\n"
     "scaler.step(opt)\nscaler.update()\nclip_grad_norm_(model.parameters(), 1.0)\n", 4),
    # PX706: apex's DDP is not torch's
    ("PX706", "from torch.nn.parallel import DistributedDataParallel as DDP\n"
     "model = DDP(net, timeout=3)\n",
     "from apex.parallel import DistributedDataParallel as DDP\n"
     "model = DDP(net, delay_allreduce=True)\n", 2),
    ("PX706", "import torch\nmodel = torch.nn.parallel.DistributedDataParallel(net, timeout=3)\n",
     "class DDP:\n    def __init__(self, net, timeout):\n        self.net = net\n"
     "model = DDP(net, timeout=3)\n", 2),
]


@pytest.mark.parametrize("code, inside, outside, line", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_error_holds_inside_and_is_silent_one_step_outside(code, inside, outside, line):
    assert errors(code, inside) == [line], inside
    assert errors(code, outside) == [], outside
