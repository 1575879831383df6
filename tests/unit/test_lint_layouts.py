"""The layout rules (PX205 sampler by the global rank under TP/PP, PX109 rank-dependent
seed under TP, PX110 a TP plan naming a missing module): each found where its premise is
proven from the file, silent one step outside it."""

from __future__ import annotations

import textwrap

import pytest

from phalanx.lint.engine import lint_source
from phalanx.lint.rules import BY_CODE


def found(code: str, source: str) -> list[tuple[int, str]]:
    return [(f.line, f.message) for f in lint_source("t.py", textwrap.dedent(source),
                                                     [BY_CODE[code]])]


TP_MESH = "mesh = init_device_mesh('cpu', (2, 2), mesh_dim_names=('dp', 'tp'))\n"
PP_MESH = "mesh = init_device_mesh('cpu', (2, 2), mesh_dim_names=('pp', 'dp'))\n"


@pytest.mark.parametrize("source, lines", [
    ("sampler = DistributedSampler(ds)\n", []),  # plain data parallelism: the global rank
    (TP_MESH + "sampler = DistributedSampler(ds)\n", [2]),
    ("run = phalanx.init(tp=2)\nsampler = DistributedSampler(ds)\n", [2]),
    ("run = phalanx.init(tp=1)\nsampler = DistributedSampler(ds)\n", []),
    (PP_MESH + "s = DistributedSampler(ds, num_replicas=2, rank=dist.get_rank())\n", [2]),
    (PP_MESH + "s = DistributedSampler(ds, num_replicas=mesh['dp'].size(),\n"
               "                       rank=mesh['dp'].get_local_rank())\n", []),
    (TP_MESH + "s = DistributedSampler(ds, dp_size, dp_rank)\n", []),
    ("generate = pipeline('text-generation')\nsampler = DistributedSampler(ds)\n", []),
    ("stage = PipelineStage(net, rank, 2, device)\nsampler = DistributedSampler(ds)\n", [2]),
])
def test_px205_a_sampler_by_the_global_rank_only_under_tp_or_pp(source, lines):
    assert [line for line, _ in found("PX205", source)] == lines


def test_px205_names_what_is_global():
    (_, message), = found("PX205", PP_MESH + "s = DistributedSampler(ds, rank=dist.get_rank())\n")
    assert "`dist.get_rank()` is the global one; under pipeline stages" in message


@pytest.mark.parametrize("source, lines", [
    ("torch.manual_seed(1234 + dist.get_rank())\n", []),  # no tensor parallelism: fine
    (TP_MESH + "torch.manual_seed(1234 + dist.get_rank())\n", [2]),
    ("model = parallelize_module(net, mesh, plan)\nrank = dist.get_rank()\n"
     "torch.manual_seed(rank)\n", [3]),
    (TP_MESH + "torch.manual_seed(1234 + dp_rank)\n", []),
    (TP_MESH + "torch.manual_seed(1234)\n", []),
])
def test_px109_a_rank_dependent_seed_only_under_tp(source, lines):
    assert [line for line, _ in found("PX109", source)] == lines


MODEL = """
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(8, 32), nn.Linear(32, 8))


class GPT(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(n)])
        self.head = nn.Linear(8, 64)

"""


@pytest.mark.parametrize("plan, names", [
    ("{'layers.*.attn.qkv': ColwiseParallel(), 'layers.*.attn.proj': RowwiseParallel(),"
     " 'layers.*.mlp.0': ColwiseParallel(), 'head': ColwiseParallel()}", []),
    ("{'layers.*.attn.prj': RowwiseParallel()}", ["prj"]),
    ("{'blocks.*.attn.qkv': ColwiseParallel()}", ["blocks"]),
    ("{'layers.*.at*.qkv': ColwiseParallel()}", []),  # a pattern torch matches
])
def test_px110_a_plan_key_resolved_through_the_models_classes(plan, names):
    source = MODEL + f"model = GPT(4)\nmodel = parallelize_module(model, mesh, {plan})\n"
    got = found("PX110", source)
    assert [m.split("submodule matching `")[1].split("`")[0] for _, m in got] == names


def test_px110_knows_phalanx_tp_plan_and_plans_held_in_a_name():
    source = MODEL + ("plan = {'layers.*.attn.qvk': 'colwise'}\n"
                      "model, opt = run.setup(GPT(4), make_opt, tp_plan=plan)\n")
    (_, message), = found("PX110", source)
    assert "GPT has no submodule matching `qvk`" in message


@pytest.mark.parametrize("source", [
    "from models import GPT\nmodel = parallelize_module(GPT(4), mesh, {'nope': x})\n",
    "class GPT(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    "        self.add_module('head', nn.Linear(2, 2))\n"
    "model = parallelize_module(GPT(), mesh, {'head': x})\n",
    "class GPT(Base):\n    def __init__(self):\n        super().__init__()\n"
    "model = parallelize_module(GPT(), mesh, {'head': x})\n",
])
def test_px110_silent_when_the_model_is_not_known_well_enough(source):
    assert found("PX110", source) == []
