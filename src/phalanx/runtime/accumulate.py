"""Gradient accumulation: count micro-steps, skip the gradient sync on all but the last."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.nn as nn

from phalanx.errors import UserError
from phalanx.strategies.base import BackwardSyncControl, Strategy


class Accumulator:
    """Counts micro-steps; gradients sync only on the last of every `steps`."""

    def __init__(self, strategy: Strategy, model: nn.Module, steps: int) -> None:
        if steps < 1:
            raise UserError(f"accumulation steps must be >= 1, got {steps} (`--grad-accum`).")
        self.strategy, self.model, self.steps, self.count = strategy, model, steps, 0

    @property
    def is_last(self) -> bool:
        """Whether the micro-step about to run closes the window (and syncs)."""
        return self.count % self.steps == self.steps - 1

    def micro_step(self) -> AbstractContextManager:
        skip = not self.is_last
        self.count += 1
        if isinstance(self.strategy, BackwardSyncControl):
            return self.strategy.no_backward_sync(self.model, enabled=skip)
        return nullcontext()

    def backward(self, loss: torch.Tensor, scaler: Any = None) -> None:
        """Backward of `loss / steps` (through `scaler` when given)."""
        loss = loss / self.steps
        (scaler.scale(loss) if scaler is not None else loss).backward()

    @property
    def boundary(self) -> bool:
        """True right after the micro-step that closed a window: time to step."""
        return self.count % self.steps == 0
