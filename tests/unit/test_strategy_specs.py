"""Strategy specs: the one torch-free description of each strategy that config
validation (before launch) and the worker (inside `phalanx.init`) both use."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from phalanx.config.sections import STRATEGIES, build_config
from phalanx.errors import UserError
from phalanx.launch.ranks import check_world
from phalanx.strategies import SPECS, default_name, spec
from phalanx.strategies.blocks import describe, find_blocks
from phalanx.train.worker import strategy_options


def test_config_choices_are_the_registry():
    assert STRATEGIES == tuple(SPECS) == ("single", "ddp", "zero", "fsdp")
    assert default_name(1) == "single" and default_name(2) == "ddp"


def test_specs_import_no_torch():
    code = ("import sys, phalanx.config.sections, phalanx.strategies; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_cli_starts_without_torch():
    """Every verb's module and parser load without torch: torch reads
    TORCH_CPP_LOG_LEVEL when it is imported, so a CLI that imported it at start could no
    longer quiet c10d's retry lines (`quiet_store_retries`): a multi-node launch that
    cannot reach its rendezvous printed C++ frames instead of one line (b36a7c7)."""
    code = ("import sys, phalanx.cli.dispatch as d, phalanx.cli.entry; "
            "from phalanx.cli import build_parser; build_parser(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.parametrize("name", list(SPECS))
def test_each_strategy_gets_only_its_own_options(name):
    cfg = build_config({"dist": {"strategy": name}, "train": {"grad_accum": 2}})
    options = strategy_options(cfg, world=2)
    assert set(options) == {f.name for f in dataclasses.fields(SPECS[name].options)}
    if "static_graph" in options:  # DDP's static graph is off under accumulation
        assert options["static_graph"] is False


def test_fsdp_options_come_from_their_flags():
    cfg = build_config({"dist": {"strategy": "fsdp", "fsdp_reshard_after_forward": False,
                                 "fsdp_grad_sync": "last"}})
    assert strategy_options(cfg, 2) == {"reshard_after_forward": False, "bf16_reduce": False,
                                        "cpu_offload": False, "grad_sync": "last"}


@pytest.mark.parametrize("name, nproc, needle", [
    ("single", 2, "unrelated copies"),
    ("zero", 1, "at world size 1 means nothing"),
])
def test_pre_launch_checks_are_the_specs(name, nproc, needle):
    cfg = build_config({"dist": {"strategy": name}})
    with pytest.raises(UserError, match=needle):
        check_world(cfg, nproc, cuda=False)
    with pytest.raises(UserError, match=needle):  # the same check a worker runs
        spec(name).check(spec(name).options(), nproc, False)


def test_unknown_strategy_and_option_are_named():
    with pytest.raises(UserError, match="unknown strategy `fsdp2`; available: single, ddp"):
        spec("fsdp2")
    with pytest.raises(UserError, match="`grad_sync` is not an option of strategy `ddp`"):
        spec("ddp").make_options(grad_sync="last")


def test_blocks_are_the_largest_list_of_one_class():
    import torch.nn as nn

    from phalanx.models import GPTConfig, MiniGPT

    model = MiniGPT(GPTConfig(block_size=8, n_layer=3, n_head=2, n_embd=8))
    blocks = find_blocks(model)
    assert blocks == list(model.blocks)
    assert describe(model, blocks) == "3 blocks `blocks.0`…`blocks.2` (Block)"
    assert find_blocks(nn.Linear(2, 2)) == []
    assert "no repeated blocks" in describe(nn.Linear(2, 2), [])
    model = MiniGPT(GPTConfig(block_size=8, n_layer=5, n_head=2, n_embd=8,
                              tie_embeddings=False))
    model.keep_stage(1, 2)  # a pipeline stage: blocks 3 and 4, under their own names
    assert describe(model, find_blocks(model)) == "2 blocks `blocks.3`…`blocks.4` (Block)"
