"""One process, one replica: nothing to synchronise."""

from __future__ import annotations

import torch.nn as nn

from phalanx.strategies.base import Strategy


class SingleStrategy(Strategy):
    name = "single"

    def start_from_rank0(self, model: nn.Module) -> None:
        """Nothing to agree on: one replica (also when `bench --scaling` times one rank
        alone inside a larger launch, while the other ranks wait)."""

    def wrap(self, model: nn.Module) -> nn.Module:
        return model
