"""One process, one replica: nothing to synchronise."""

from __future__ import annotations

import torch.nn as nn

from phalanx.strategies.base import Strategy


class SingleStrategy(Strategy):
    name = "single"

    def wrap(self, model: nn.Module) -> nn.Module:
        return model
