"""One process, one replica: nothing to synchronise."""

from __future__ import annotations

import torch.nn as nn

from phalanx.errors import UserError
from phalanx.strategies.base import Strategy


class SingleStrategy(Strategy):
    name = "single"

    def check(self) -> None:
        if self.run.world_size > 1:
            raise UserError(
                f"`--strategy single` with {self.run.world_size} ranks would train "
                f"{self.run.world_size} unrelated copies of the model. Use `--strategy ddp`, "
                f"or run one process (`--nproc-per-node 1`).")

    def wrap(self, model: nn.Module) -> nn.Module:
        return model
