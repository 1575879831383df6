"""Worker for tests/dist/test_start_weights.py: what each strategy holds right after
setup, when every rank's generator drew something different (as `phalanx.init` seeds
them: from (seed, rank)).

For each strategy and model kind, every rank reseeds from its rank, builds the model
and sets it up; rank 0 saves the full weights to OUT/<strategy>-<kind>-w<world>.pt.
Last, a planted splice: the broadcast before sharding does nothing, and setup must fail.
Usage: python start_scenarios.py OUT
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from unittest import mock

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

import phalanx
from phalanx.errors import DistributedError
from phalanx.strategies import make_strategy, start


class OwnInit(nn.Module):
    """A module with its own `init_weights` (and a non-persistent buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(5, 5) for _ in range(3))
        self.head = nn.Linear(5, 7)
        self.register_buffer("scale", torch.empty(5), persistent=False)
        self.init_weights()

    def init_weights(self) -> None:
        for block in self.blocks:
            nn.init.normal_(block.weight, std=0.5)
            nn.init.uniform_(block.bias)
        nn.init.normal_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.scale.copy_(torch.rand(5))

    def forward(self, x):
        for block in self.blocks:
            x = torch.relu(block(x)) * self.scale
        return self.head(x)


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=101,
                                      n_positions=16))


def on_meta() -> nn.Module:
    with torch.device("meta"):
        return OwnInit()


KINDS = {"transformers": gpt2, "own_init": OwnInit, "meta": on_meta}


def full_weights(strategy, model: nn.Module) -> dict:
    wrapped = strategy.setup_module(model, strategy.precision("fp32"))
    return {k: v.detach().clone().cpu() for k, v in strategy.full_state_dict(wrapped).items()}


def main(out: Path) -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    with phalanx.init(seed=0, threads=1) as run:
        world, rank = run.world_size, run.rank
        topology = replace(run.topology, mesh=init_device_mesh("cpu", (world,),
                                                                mesh_dim_names=("dp",)))
        names = ["single"] if world == 1 else ["ddp", "zero", "fsdp"]
        for name in names:
            for kind, build in KINDS.items():
                torch.manual_seed(1000 + rank)  # every rank draws differently
                full = full_weights(make_strategy(name, topology), build())
                if rank == 0:
                    torch.save(full, out / f"{name}-{kind}-w{world}.pt")
        if world > 1:
            planted_splice(topology, out, rank)


def planted_splice(topology, out: Path, rank: int) -> None:
    """The broadcast before sharding does nothing: the guard must refuse the splice."""
    torch.manual_seed(1000 + rank)
    with mock.patch.object(start, "broadcast_from_rank0", lambda model: None):
        try:
            full_weights(make_strategy("fsdp", topology), OwnInit())
        except DistributedError as exc:
            message = str(exc)
        else:
            message = "setup accepted the splice"
    if rank == 0:
        (out / "splice.txt").write_text(message)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
