"""`phalanx lint`'s model of the code against the false findings of the second held-out
study: a state-dict helper is DCP's (a collective) only when the import says so — not
Accelerate's `accelerator.get_state_dict` (PX301); a collective on a process group of its
own under a rank guard (PX301); Megatron's group ranks (`mpu.get_data_parallel_rank()`,
`dp_rank`) read as ranks (PX504) — each silent case next to the true one still found."""

from __future__ import annotations

import pytest

from phalanx.lint.engine import lint_source
from phalanx.lint.rules import BY_CODE


def codes(source: str, *wanted: str) -> list[tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source("s.py", source, [BY_CODE[c] for c in wanted])]


# 1. DCP's state-dict helpers, by import ------------------------------------------------------

ACCEL = ("import torch\nfrom accelerate import Accelerator\nacc = Accelerator()\n"
         "model = acc.prepare(torch.nn.Linear(4, 4))\n\ndef save():\n"
         "    if not acc.is_local_main_process:\n        return\n"
         "    torch.save({{'model': {call}}}, 'ckpt.pt')\n")


def test_accelerates_get_state_dict_is_no_definite_collective():
    assert codes(ACCEL.format(call="acc.get_state_dict(model)"), "PX301", "PX303") == []


@pytest.mark.parametrize("imports, call", [
    ("from torch.distributed.checkpoint.state_dict import get_state_dict",
     "get_state_dict(model, opt)"),
    ("import torch.distributed.checkpoint as dcp", "dcp.state_dict.get_state_dict(model, opt)"),
    ("from torch.distributed import checkpoint", "checkpoint.save(sd, checkpoint_id='c')"),
    ("import torch.distributed.checkpoint", "torch.distributed.checkpoint.save(sd)"),
])
def test_dcps_helpers_by_import_are_still_collectives(imports, call):
    """DCP's save on the default group is proven (PX301); its state-dict helpers gather
    only for a sharded model (PX303)."""
    source = (f"import torch, torch.distributed as dist\n{imports}\n\ndef save(model, opt, sd):\n"
              f"    if dist.get_rank() != 0:\n        return\n    x = {call}\n")
    tier = "PX301" if ".save(" in call else "PX303"
    assert codes(source, "PX301", "PX303") == [(tier, 7)]


def test_torch_save_and_another_objects_save_are_not_dcp():
    source = ("import torch, torch.distributed as dist\nimport torch.distributed.checkpoint as dcp"
              "\n\ndef save(sd, store):\n    if dist.get_rank() == 0:\n"
              "        torch.save(sd, 'a.pt')\n        store.save(sd)\n")
    assert codes(source, "PX301", "PX303") == []


# 2. a collective on a process group of its own ------------------------------------------------

SUBGROUP = ("import os, torch.distributed as dist\ndist.init_process_group('nccl')\n"
            "replicate, shard = dist.new_group([0, 8]), dist.new_group(list(range(8)))\n"
            "obj = [None]\nif int(os.environ['LOCAL_RANK']) == 0 or dist.get_rank(shard) == 0:\n"
            "    {call}\n")


@pytest.mark.parametrize("call", [
    "dist.broadcast_object_list(obj, src=0, group=replicate)",
    "dist.broadcast_object_list(obj, 0, replicate)",
    "dist.barrier(group=replicate)",
])
def test_a_collective_on_its_own_group_under_a_rank_guard_is_silent(call):
    assert codes(SUBGROUP.format(call=call), "PX301", "PX303") == []


@pytest.mark.parametrize("call", [
    "dist.broadcast_object_list(obj, src=0)",
    "dist.broadcast_object_list(obj, src=0, group=None)",
    "dist.barrier(group=dist.group.WORLD)",
    "dist.all_reduce(t, dist.ReduceOp.SUM)",
])
def test_a_collective_on_the_world_under_a_rank_guard_is_still_found(call):
    # (LOCAL_RANK and a subgroup's rank are not the global rank: not proven)
    assert codes(SUBGROUP.format(call=call), "PX301", "PX303") == [("PX303", 6)]


# 3. group ranks -----------------------------------------------------------------------------

MEGATRON = ("import os, torch\nimport torch.distributed as dist\n"
            "from megatron.core import parallel_state as mpu\n\n{body}\n\n"
            "def sync():\n    dist.barrier()\n")


@pytest.mark.parametrize("body", [
    "def save(sd, d):\n    if mpu.get_data_parallel_rank() == 0:\n"
    "        tp = mpu.get_tensor_model_parallel_rank()\n"
    "        torch.save(sd, os.path.join(d, f'mp_rank_{tp:02d}.pth'))",
    "def save(sd, name):\n    dp_rank = mpu.get_data_parallel_rank() if dist.is_initialized()"
    " else 0\n    if not dist.is_initialized() or dp_rank == 0:\n        torch.save(sd, name)",
    "def save(state):\n    first = mpu.get_tensor_model_parallel_rank() == 0\n"
    "    if not first:\n        return\n    torch.save(state, 'dl.pt')",
])
def test_group_ranks_guard_a_save(body):
    assert codes(MEGATRON.format(body=body), "PX504") == []


def test_a_save_under_a_test_of_no_rank_is_still_found():
    body = "def save(sd, name):\n    if mpu.is_initialized():\n        torch.save(sd, name)"
    assert codes(MEGATRON.format(body=body), "PX504") == [("PX504", 7)]


def test_a_group_rank_does_not_report_a_subgroup_collective():
    body = ("def sync(g):\n    if mpu.get_data_parallel_rank() == 0:\n"
            "        dist.all_reduce(t, group=mpu.get_tensor_model_parallel_group())")
    assert codes(MEGATRON.format(body=body), "PX301", "PX303") == []
    world = body.replace(", group=mpu.get_tensor_model_parallel_group()", "")
    assert codes(MEGATRON.format(body=world), "PX301", "PX303") == [("PX303", 7)]


def test_dcp_on_its_own_process_group_under_a_rank_guard_is_silent():
    source = ("import torch.distributed as dist\nfrom torch.distributed import checkpoint as cp"
              "\n\ndef save(sd, mesh):\n    first = mesh.get_local_rank(mesh_dim=0) == 0\n"
              "    if first:\n        cp.save(state_dict=sd, process_group={group})\n")
    assert codes(source.format(group="mesh.get_group(1)"), "PX301", "PX303") == []
    assert codes(source.format(group="None"), "PX301", "PX303") == [("PX303", 7)]


# a rank guard that a test of something else opens for every rank ------------------------------

OPENED = ("import torch.distributed as dist\nfrom megatron.core import parallel_state as mpu\n\n"
          "def save(sd, kind, skip):\n    dp_rank = mpu.get_data_parallel_rank()\n"
          "    if {test}:\n        dist.barrier()\n")


@pytest.mark.parametrize("test, found", [
    ("not skip and (kind != 'legacy' or dp_rank == 0)", []),
    ("kind == 'global' or dp_rank == 0", []),
    ("not dist.is_initialized() or dp_rank == 0", [("PX303", 7)]),
    ("dist.get_world_size() == 1 or dp_rank == 0", [("PX303", 7)]),
    ("skip and dp_rank == 0", [("PX303", 7)]),
    ("kind != 'legacy' and dp_rank == 0", [("PX303", 7)]),
])
def test_a_rank_guard_opened_for_every_rank_is_no_certain_split(test, found):
    assert codes(OPENED.format(test=test), "PX301", "PX303") == found


def test_a_flag_that_opens_the_guard_for_every_rank():
    source = OPENED.format(test="load_on_all or dp_rank == 0").replace("skip", "load_on_all")
    assert codes(source, "PX301", "PX303") == []
    world = OPENED.format(test="not ddp or dp_rank == 0").replace("skip", "ddp")
    assert codes(world, "PX301", "PX303") == [("PX303", 7)]


# 4. a property returning a rank test --------------------------------------------------------

PROPERTY = ("import torch\nimport torch.distributed as dist\n\nclass Trainer:\n"
            "    @property\n    def dp_rank(self):\n        return dist.get_rank()\n\n"
            "    @property\n    def should_save(self):\n        if self.sharded:\n"
            "            return True\n        return {value}\n\n"
            "    def save(self, sd, name):\n        if self.should_save:\n"
            "            torch.save(sd, name)\n\n    def sync(self):\n        dist.barrier()\n")


def test_a_property_returning_a_rank_test_guards_a_save():
    assert codes(PROPERTY.format(value="self.dp_rank == 0"), "PX504") == []


def test_a_property_returning_no_rank_guards_nothing():
    assert codes(PROPERTY.format(value="self.enabled"), "PX504") == [("PX504", 17)]


def test_a_matrix_rank_is_no_process_rank():
    """`*_rank()` reads a rank only as `get_..._rank` (review: `torch.linalg.matrix_rank`
    made a PX301 error); Megatron's group ranks still count."""
    from phalanx.lint.engine import lint_source
    from phalanx.lint.rules import ALL

    linear = ("import torch\nimport torch.distributed as dist\n"
              "if torch.linalg.matrix_rank(a) > 2:\n    dist.all_reduce(x)\n")
    group = ("import torch.distributed as dist\nfrom megatron.core import mpu\n"
             "if mpu.get_data_parallel_rank() == 0:\n    dist.all_reduce(x)\n")
    assert [f.code for f in lint_source("a.py", linear, ALL)] == []
    assert [(f.code, f.line) for f in lint_source("b.py", group, ALL)] == [("PX303", 4)]
