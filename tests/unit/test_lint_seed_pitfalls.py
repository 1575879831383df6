"""Issue 47, recall: every pitfall of the field guides (shared/seeds/) planted in a small
script of its own is found by the default rules or by the documented profile
(`--select seeds`), and docs/lint-seeds.md says which finds it. Between two precision
rounds a planted set went from 20 of 20 found to 14: a rule moved to opt-in must stay
findable, and `nn.DataParallel` in a single-process script and the `module.` prefix had
stopped being reported at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.cli.lint import chosen_rules
from phalanx.lint.engine import lint_source
from phalanx.lint.profiles import SEED_PITFALLS

DDP_HEAD = """import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
device = torch.device("cuda", local_rank)
"""
TAIL = "dist.destroy_process_group()\n"

PLANTED = {
    "PX101": "import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(4, 4).cuda())\n"
             "out = model(torch.randn(8, 4).cuda())\n",
    "PX102": DDP_HEAD + "model = Net()\nmodel = DDP(model, device_ids=[local_rank])\n"
             "model.to(device)\n" + TAIL,
    "PX104": "import os\nimport torch\nimport torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\n"
             "dist.init_process_group('nccl')\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
             "model = DDP(torch.nn.Linear(4, 4).cuda(local_rank), device_ids=[local_rank])\n"
             + TAIL,
    "PX201": DDP_HEAD + "from torch.utils.data import DataLoader\n"
             "loader = DataLoader(dataset, batch_size=8, shuffle=True)\n"
             "for x in loader:\n    pass\n" + TAIL,
    "PX202": DDP_HEAD + "from torch.utils.data import DataLoader, DistributedSampler\n"
             "loader = DataLoader(dataset, sampler=DistributedSampler(dataset), shuffle=True)\n"
             + TAIL,
    "PX203": DDP_HEAD + "from torch.utils.data import DataLoader, DistributedSampler\n"
             "sampler = DistributedSampler(dataset)\n"
             "loader = DataLoader(dataset, batch_size=8, sampler=sampler)\n"
             "for epoch in range(3):\n    for x in loader:\n        pass\n" + TAIL,
    "PX301": DDP_HEAD + "loss = torch.ones(1, device=device)\n"
             "if dist.get_rank() == 0:\n    dist.all_reduce(loss)\n    print(loss)\n" + TAIL,
    "PX401": DDP_HEAD + "model = DDP(net.to(device), device_ids=[local_rank])\n"
             "for i, (x, y) in enumerate(loader):\n"
             "    loss = criterion(model(x), y) / 4\n    loss.backward()\n"
             "    if (i + 1) % 4 == 0:\n        opt.step()\n        opt.zero_grad()\n" + TAIL,
    "PX404": DDP_HEAD + "model = DDP(net.to(device), device_ids=[local_rank])\n"
             "accum_steps = 4\n"
             "for i, (x, y) in enumerate(loader):\n"
             "    with model.no_sync():\n"
             "        loss = criterion(model(x), y)\n        loss.backward()\n"
             "    if (i + 1) % accum_steps == 0:\n        opt.step()\n        opt.zero_grad()\n"
             + TAIL,
    "PX501": DDP_HEAD + "state = torch.load('checkpoint.pt')\n" + TAIL,
    "PX502": DDP_HEAD + "state = torch.load('checkpoint.pt', map_location=device, "
             "weights_only=False)\n" + TAIL,
    "PX503": DDP_HEAD + "model = DDP(net.to(device), device_ids=[local_rank])\n"
             "if dist.get_rank() == 0:\n    torch.save(model.state_dict(), 'model.pt')\n"
             + TAIL,
    "PX504": DDP_HEAD + "model = DDP(net.to(device), device_ids=[local_rank])\n"
             "torch.save(model.module.state_dict(), 'model.pt')\n" + TAIL,
    "PX601": "import torch\nscaler = torch.amp.GradScaler('cuda')\n"
             "scaler.scale(loss).backward()\n"
             "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
             "scaler.unscale_(opt)\nscaler.step(opt)\nscaler.update()\n",
    "PX602": "import torch\nscaler = torch.amp.GradScaler('cuda')\n"
             "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)\n"
             "scaler.scale(loss).backward()\n",
    "PX603": "import torch\nscaler = torch.cuda.amp.GradScaler()\n",
    "PX701": DDP_HEAD.replace('dist.init_process_group("nccl")\n', "") +
             "os.environ['MASTER_PORT'] = '29500'\ndist.init_process_group('nccl')\n" + TAIL,
    "PX702": DDP_HEAD + "model = DDP(net.to(device), device_ids=[local_rank])\n",
    "PX703": DDP_HEAD + "model = DDP(net.to(device), device_ids=[local_rank], "
             "find_unused_parameters=True)\n" + TAIL,
    "PX704": DDP_HEAD + "net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), "
             "torch.nn.BatchNorm2d(8))\nmodel = DDP(net.to(device), device_ids=[local_rank])\n"
             + TAIL,
    "PX705": DDP_HEAD + "model = DDP(net.to(device), device_ids=[local_rank])\n"
             "for x, y in loader:\n    loss = criterion(model(x), y)\n"
             "    if dist.get_rank() == 0:\n        print(f'loss {loss.item()}')\n" + TAIL,
    "PX706": DDP_HEAD + "from datetime import timedelta\n"
             "model = DDP(net.to(device), device_ids=[local_rank], "
             "timeout=timedelta(minutes=30))\n" + TAIL,
    "PX801": "import torch\nimport torch.distributed as dist\n"
             "from torch.nn.parallel import DistributedDataParallel as DDP\n"
             "dist.init_process_group('nccl')\nrank = dist.get_rank()\n"
             "torch.cuda.set_device(rank)\nmodel = DDP(net.to(rank), device_ids=[rank])\n"
             + TAIL,
}
PAGE = Path(__file__).parents[2] / "docs" / "lint-seeds.md"


def test_every_pitfall_is_planted_once():
    assert sorted(PLANTED) == sorted(code for _, code in SEED_PITFALLS)


@pytest.mark.parametrize("pitfall, code", SEED_PITFALLS, ids=[c for _, c in SEED_PITFALLS])
def test_each_pitfall_is_found_by_the_profile_the_page_names(pitfall, code):
    default = {r.code for r in chosen_rules("", "")}
    profile = "default" if code in default else "seeds"
    rules = chosen_rules("" if profile == "default" else "seeds", "")
    codes = [f.code for f in lint_source("planted.py", PLANTED[code], rules)]
    assert code in codes, (pitfall, codes)
    row = next((line for line in PAGE.read_text().splitlines()
                if line.startswith(f"| {pitfall} |")), None)
    assert row == f"| {pitfall} | {code} | `{profile}` |", (
        f"docs/lint-seeds.md's pitfall table must say `| {pitfall} | {code} | `{profile}` |`")


def test_the_seeds_profile_is_every_pitfalls_rule_and_no_other():
    assert sorted(r.code for r in chosen_rules("seeds", "")) == \
        sorted(code for _, code in SEED_PITFALLS)
    assert {r.code for r in chosen_rules("Seeds,PX9", "")} >= {"PX101", "PX901", "PX902"}
