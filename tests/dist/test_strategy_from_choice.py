"""`phalanx.init(strategy=choice)` in a one-process world: torch's DDP gets exactly the
options the choice carries, and the strategies' tensor helpers see FSDP's shards."""

from __future__ import annotations

import torch
import torch.nn as nn

import phalanx
from phalanx.config.sections import build_config
from phalanx.config.strategy import choose
from phalanx.strategies.tensors import compiled, is_shard, local_tensor, uncompiled, user_name


def test_ddp_is_built_from_the_choice_and_says_its_tuning():
    cfg = build_config({"dist": {"strategy": "ddp", "bucket_cap_mb": 1, "static_graph": True,
                                 "find_unused_parameters": True}, "train": {"grad_accum": 2}})
    choice = choose(cfg.dist, 1, cfg.train.grad_accum)
    with phalanx.init(seed=0, threads=1, strategy=choice) as run:
        model = run.setup(nn.Linear(2, 2))
        assert run.strategy.options is choice.options
        assert model.bucket_bytes_cap == 2 ** 20 and model.find_unused_parameters
        assert not model.static_graph  # settled: accumulation
        assert run.strategy.note == ("ddp: DistributedDataParallel built with bucket_cap_mb=1, "
                                     "find_unused_parameters=True")
        assert run.setup(nn.Linear(2, 2)) is not None and run.strategy.note  # said per setup
    with phalanx.init(seed=0, threads=1, strategy="ddp") as run:
        run.setup(nn.Linear(2, 2))
        assert run.strategy.note == ""  # the defaults: nothing to say


def test_tensor_helpers_see_fsdp_shards_and_the_compile_wrapper():
    from phalanx.models import GPTConfig, MiniGPT

    with phalanx.init(seed=0, threads=1, strategy="fsdp") as run:
        model = run.setup(MiniGPT(GPTConfig(block_size=8, n_layer=1, n_head=2, n_embd=8)))
        params = list(model.parameters())
        assert all(is_shard(p) for p in params)
        assert not any(is_shard(local_tensor(p)) for p in params)
    plain = torch.ones(2)
    assert local_tensor(plain) is plain and not is_shard(plain)
    inner = nn.Linear(2, 2)
    wrapped = torch.compile(inner)
    assert uncompiled(wrapped) is inner and compiled(wrapped) and not compiled(inner)
    assert user_name("module._orig_mod.blocks.0.weight") == "blocks.0.weight"
