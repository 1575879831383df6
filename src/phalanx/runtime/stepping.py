"""`Run`'s optimizer-step methods: the global gradient clip and the step, right under
every precision — fp16 unscales before the clip and steps through the loss scaler, so a
user's loop never calls `unscale_`, `scaler.step` or `scaler.update` itself."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from phalanx.errors import UserError


class StepMethods:
    """Mixed into `Run` (which provides strategy, precision and the optimizers `setup`
    built, by model)."""

    strategy: Any
    precision: Any
    _optimizers: Any

    def clip_grad_norm_(self, model: nn.Module, max_norm: float,
                        optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """Clip the global gradient norm to `max_norm` (over every rank's gradients,
        sharded or not); returns the norm before clipping, equal on every rank. Under
        fp16 the gradients are unscaled first (the optimizer `setup` built, or
        `optimizer`), so the norm and the clip are in true units."""
        scaler = self.precision.scaler if self.precision is not None else None
        if scaler is not None:
            opt = self._fp16_optimizer(model, optimizer)
            if _stage(scaler, opt) != "unscaled":
                scaler.unscale_(opt)
        return self.strategy.clip_grad_norm_(model, max_norm)

    def step(self, optimizer: torch.optim.Optimizer, *, zero_grad: bool = True) -> bool:
        """The optimizer step at an accumulation boundary: under fp16 through the loss
        scaler (unscaled if `clip_grad_norm_` did not already, skipped when a gradient
        is inf/NaN, the scale updated); then the gradients are zeroed (set to None).
        Returns whether the parameters were stepped (False: fp16 skipped an overflow)."""
        scaler = self.precision.scaler if self.precision is not None else None
        stepped = True
        if scaler is None:
            optimizer.step()
        else:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            stepped = scaler.get_scale() >= before  # the scale shrinks on a skipped step
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        return stepped

    def _fp16_optimizer(self, model: nn.Module,
                        given: torch.optim.Optimizer | None) -> torch.optim.Optimizer:
        found = given if given is not None else self._optimizers.get(model)
        if found is None:
            raise UserError("run.clip_grad_norm_ under fp16 must unscale the gradients "
                            "first, and no optimizer is known for this model: pass it to "
                            "run.setup(model, optimizer, ...) or to "
                            "run.clip_grad_norm_(model, max_norm, optimizer=opt).")
        return found


def _stage(scaler: Any, optimizer: torch.optim.Optimizer) -> str:
    """The loss scaler's stage for `optimizer` ("ready", "unscaled", "stepped")."""
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer))
    stage = state.get("stage") if state else None
    return getattr(stage, "name", "READY").lower()
