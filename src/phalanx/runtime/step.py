"""One training step of the built-in trainer, on the public `Run` API: the micro-steps of
an accumulation window, then the optimizer step. `phalanx train`, `phalanx bench` and
`phalanx plan` all time and train with these same two functions."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from phalanx.runtime.accumulate import Accumulator
from phalanx.strategies.precision import Precision

if TYPE_CHECKING:
    from phalanx.runtime.run import Run


@dataclass(frozen=True)
class StepOutcome:
    norm: torch.Tensor | None  # the gradient norm before clipping (None: no clipping)
    skipped: bool  # `check` found the step bad: the gradients were dropped, nothing stepped


def micro_steps(model: nn.Module, acc: Accumulator, batches: Iterator, precision: Precision,
                timing=None) -> torch.Tensor:
    """Forward and backward over one accumulation window; returns the mean local loss.
    `timing()`: a context that times data loading and forward (StragglerWatch)."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for _ in range(acc.steps):
        with acc.micro_step():  # under the run's precision (autocast)
            with timing() if timing is not None else contextlib.nullcontext():
                x, y = next(batches)
                _, loss = model(x, y)
            acc.backward(loss, precision.scaler)
        total += loss.detach().float()
    return total / acc.steps


def optimizer_step(run: Run, model: nn.Module, opt: torch.optim.Optimizer, grad_clip: float,
                   check: Callable[[torch.Tensor | None], bool] | None = None) -> StepOutcome:
    """Unscale (fp16) → clip (the strategy's: the global norm, sharded or not) → step →
    zero, in that order. Returns the gradient norm before clipping and whether the step
    was skipped. Either way it counts one optimizer step (`run.optimizer_steps`, as
    `run.step` does).

    `check(norm)` (the NaN guard) is asked before stepping; when it says the step is bad
    the gradients are dropped and nothing steps (`skipped`). Under fp16 it is not asked:
    the scaler skips such steps itself (and that is not reported as `skipped`)."""
    assert run.precision is not None  # set by run.setup
    run.optimizer_steps += 1
    scaler = run.precision.scaler
    if scaler is not None:
        scaler.unscale_(opt)
    norm = run.clip_grad_norm_(model, grad_clip) if grad_clip > 0 else None
    if check is not None and scaler is None and check(norm):
        opt.zero_grad(set_to_none=True)
        return StepOutcome(norm, skipped=True)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return StepOutcome(norm, skipped=False)
