"""`phalanx lint`'s PX104 ("no torch.cuda.set_device") against the false positives found
on public training code: an init that creates no NCCL communicator (a literal gloo
backend, a fake one-process group, XLA) and an init after a call to an unseen helper
that picks the device (Composer's `get_device`) — each silent case next to the true one
still found."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.lint.engine import lint_source
from phalanx.lint.project import build_project
from phalanx.lint.rules import ALL, BY_CODE

HEAD = "import torch\nimport torch.distributed as dist\n"


def px104(source: str) -> list[int]:
    return [f.line for f in lint_source("s.py", source, [BY_CODE["PX104"]])]


# 1. an init that creates no NCCL communicator ------------------------------------------

EXPLICIT = "device = torch.device(f'cuda:{rank % torch.cuda.device_count()}')\n" \
           "model = Net().to(device)\n"


@pytest.mark.parametrize("init", [
    "dist.init_process_group('gloo', rank=rank, world_size=world_size)\n",
    "dist.init_process_group(backend='gloo')\n",
    "dist.init_process_group(backend, init_method='xla://')\n",
    "dist.init_process_group('xla')\n",
    "dist.init_process_group(backend, store=dist.HashStore(), world_size=1, rank=0)\n",
])
def test_an_init_without_nccl_needs_no_set_device(init):
    """gloo/XLA/a one-process group: no NCCL communicator, and every tensor is placed on
    an explicit per-rank GPU — nothing lands on GPU 0."""
    assert px104(HEAD + init + EXPLICIT) == []


@pytest.mark.parametrize("init", [
    "dist.init_process_group('nccl')\n",
    "dist.init_process_group(backend='cpu:gloo,cuda:nccl')\n",
    "dist.init_process_group(backend)\n",
    "dist.init_process_group('nccl' if torch.cuda.is_available() else 'gloo')\n",
    "dist.init_process_group()\n",
])
def test_an_nccl_or_unknown_backend_is_still_found(init):
    assert px104(HEAD + init + EXPLICIT) == [3]


@pytest.mark.parametrize("uses", ["x = torch.zeros(1).cuda()\n",
                                  "model = Net().to(torch.device('cuda'))\n"])
def test_gloo_with_the_current_device_is_still_found(uses):
    """Whatever the backend, a bare `.cuda()` or the device "cuda" is GPU 0 in every rank
    until set_device."""
    assert px104(HEAD + "dist.init_process_group('gloo')\n" + uses) == [3]


def test_each_arm_is_judged_on_its_own():
    source = HEAD + ("if xla:\n    dist.init_process_group('xla', init_method='xla://')\n"
                     "else:\n    dist.init_process_group('nccl')\n") + EXPLICIT
    assert px104(source) == [6]


# 2. a device picked by a helper the linter cannot see ----------------------------------

INITIALIZE = HEAD + ("from mylib.devices import get_device\n\n\n"
                     "def initialize_dist(device=None):\n"
                     "{before}"
                     "    dist.init_process_group(dev.dist_backend)\n"
                     "{after}"
                     "    x = torch.ones(1, device='cuda:' + str(rank))\n")


def test_an_unseen_helper_that_picks_the_device_before_the_init():
    pick = "    dev = get_device(device)\n"
    assert px104(INITIALIZE.format(before=pick, after="")) == []
    # still found: the helper runs after the init, or is no device helper
    assert px104(INITIALIZE.format(before="", after=pick)) == [7]
    other = INITIALIZE.replace("get_device", "get_config")
    assert px104(other.format(before="    dev = get_config(device)\n", after="")) == [8]


@pytest.mark.parametrize("imported", ["from torch.cuda import current_device as get_device\n",
                                      "def get_device(name):\n    return name\n"])
def test_a_device_helper_the_linter_sees_is_no_excuse(imported):
    """From torch (it picks no GPU for the rank), or defined in the file: not unseen."""
    source = INITIALIZE.replace("from mylib.devices import get_device\n", imported)
    assert px104(source.format(before="    dev = get_device(device)\n", after=""))


def test_a_device_helper_defined_in_another_linted_file(tmp_path: Path):
    """`get_device` defined in a linted module that chooses no GPU: seen, still found."""
    files = {"mylib/devices.py": "def get_device(name):\n    return name\n",
             "train.py": INITIALIZE.format(before="    dev = get_device(device)\n",
                                           after="")}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    paths = sorted(tmp_path.rglob("*.py"))
    project = build_project(paths)
    train = tmp_path / "train.py"
    assert [f.code for f in lint_source(str(train), train.read_text(), ALL, project)
            if f.code == "PX104"] == ["PX104"]
