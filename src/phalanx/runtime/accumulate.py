"""Gradient accumulation: count micro-steps, skip the gradient sync on all but the last;
each micro-step under the run's precision (autocast), its backward through the fp16 loss
scaler — so a user's loop never touches autocast or a scaler. The backward is timed as a
wait for the other ranks (`waiting`: the gradient sync; the straggler check's)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

import torch
import torch.nn as nn

from phalanx.errors import UserError
from phalanx.strategies.base import BackwardSyncControl, Strategy
from phalanx.strategies.precision import Precision


class Accumulator:
    """Counts micro-steps; gradients sync only on the last of every `steps`. `seed(i)`
    seeds the RNG for micro-step i of a window (`Run._seed_micro_step`)."""

    def __init__(self, strategy: Strategy, model: nn.Module, steps: int,
                 precision: Precision | None = None,
                 seed: Callable[[int], None] | None = None,
                 waiting: Callable[[], AbstractContextManager] = nullcontext) -> None:
        if steps < 1:
            raise UserError(f"accumulation steps must be >= 1, got {steps} (`--grad-accum`).")
        self.strategy, self.model, self.steps, self.count = strategy, model, steps, 0
        self.precision, self.seed, self.waiting = precision, seed, waiting

    @property
    def is_last(self) -> bool:
        """Whether the micro-step about to run closes the window (and syncs)."""
        return self.count % self.steps == self.steps - 1

    def micro_step(self) -> AbstractContextManager:
        """The context of one micro-step's forward and backward, its RNG seeded (its own
        dropout masks); no gradient sync unless it closes the window; autocast under
        bf16/fp16; the strategy's loss context (tensor parallelism: torch's
        `loss_parallel`, whose backward must run inside it too)."""
        skip = not self.is_last
        if self.seed is not None:
            self.seed(self.count % self.steps)
        self.count += 1
        stack = ExitStack()
        if isinstance(self.strategy, BackwardSyncControl):
            stack.enter_context(self.strategy.no_backward_sync(self.model, enabled=skip))
        if self.precision is not None:
            stack.enter_context(self.precision.autocast())
        stack.enter_context(self.strategy.loss_context())  # (TP: loss parallel)
        return stack

    def backward(self, loss: torch.Tensor, scaler: Any = None) -> None:
        """Backward of `loss / steps`, through `scaler` (default: the fp16 loss scaler of
        the run's precision, if any)."""
        if scaler is None and self.precision is not None:
            scaler = self.precision.scaler
        loss = loss / self.steps
        # outside autocast, as torch's AMP recipe runs it (micro_step's block holds both)
        with torch.autocast(loss.device.type, enabled=False), self.waiting():
            (scaler.scale(loss) if scaler is not None else loss).backward()

    @property
    def boundary(self) -> bool:
        """True right after the micro-step that closed a window: time to step."""
        return self.count % self.steps == 0
