"""ZeRO stage 1: DDP for the gradients, `ZeroRedundancyOptimizer` for the optimizer.

Every rank still holds the whole model and the whole (all-reduced) gradient, so
wrapping, accumulation (`no_sync`), clipping and replica checks are DDP's. The optimizer
state is partitioned: each rank keeps and updates only the parameters assigned to it,
then broadcasts them. The ZeRO paper's accounting for mixed-precision Adam: 4Ψ + 12Ψ/N
bytes per rank instead of DDP's 16Ψ; in fp32 (Phalanx's CPU default) the optimizer's
8Ψ of moments become 8Ψ/N.

Checkpoints do not use `consolidate_state_dict` (it gathers every state on one rank and
can only be reloaded at the same world size): each rank writes its own parameters'
optimizer state through DCP under the parameter's name, exactly as DDP names it, so a
zero checkpoint resumes under ddp or fsdp and at any world size, and the other way round.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.optim import ZeroRedundancyOptimizer

from phalanx.checkpoint import store
from phalanx.errors import UserError
from phalanx.strategies import state_dict
from phalanx.strategies.ddp import DDPStrategy


class ZeroStrategy(DDPStrategy):
    name = "zero"

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The same optimizer class, hyperparameters and parameter groups, partitioned."""
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            return optimizer
        if optimizer.state:
            raise UserError("`--strategy zero` re-creates the optimizer partitioned across "
                            "ranks, and this one has stepped already (it holds state). Build "
                            "it in run.setup() (pass a factory) before the first step.")
        groups = [dict(g) for g in optimizer.param_groups]
        accepted = inspect.signature(type(optimizer).__init__).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)

    def time_optimizer_waits(self, optimizer, waiting) -> None:
        """After its local step ZeRO broadcasts each rank's parameters (torch's
        `_sync_params`): a wait. (A torch without that method: the step counts whole.)"""
        super().time_optimizer_waits(optimizer, waiting)
        sync = getattr(optimizer, "_sync_params", None)
        if sync is None:
            return

        def timed_sync():
            with waiting():
                return sync()

        optimizer._sync_params = timed_sync

    def local_optimizer(self, optimizer):
        """The optimizer over this rank's partition (inside a ZeroRedundancyOptimizer)."""
        return getattr(optimizer, "optim", optimizer)

    def save_state(self, model: nn.Module, optimizer) -> dict:
        """The model like DDP's (each tensor written by one rank); the optimizer state of
        the parameters this rank owns, under their names."""
        module = self.unwrap(model)
        t = self.topology
        state = state_dict.share_of_replicated({"model": module.state_dict()}, t.rank,
                                               t.world_size, self._share_plans)
        if optimizer is not None:
            local = self.local_optimizer(optimizer)
            state["optim"] = state_dict.direct_state(module, local)["optim"]
        return state

    def load_template(self, model: nn.Module, optimizer) -> tuple[dict, dict]:
        """The whole model (every rank holds it) and this rank's partition's state."""
        msd = get_model_state_dict(model)
        if optimizer is None:
            return {"model": msd}, {"state": {}, "param_groups": []}
        osd = get_optimizer_state_dict(model, self.local_optimizer(optimizer))
        return {"model": msd, "optim": osd["state"]}, osd

    def apply_state(self, model: nn.Module, optimizer, state: dict, osd: dict) -> None:
        local = None if optimizer is None else self.local_optimizer(optimizer)
        store.dcp_apply(model, local, state, osd)
