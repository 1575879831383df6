"""One training step of the built-in trainer, on the public `Run` API: the micro-steps of
an accumulation window (through the pipeline schedule under `--pp`), then the optimizer
step. `phalanx train`, `phalanx bench` and
`phalanx plan` all time and train with these same two functions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
from torch.profiler import record_function

from phalanx.cluster.faults import slow_point
from phalanx.runtime.accumulate import Accumulator
from phalanx.strategies.precision import Precision

if TYPE_CHECKING:
    from phalanx.runtime.run import Run


@dataclass(frozen=True)
class StepOutcome:
    norm: torch.Tensor | None  # the gradient norm before clipping (None: no clipping)
    stepped: bool  # the parameters moved: `run.step`'s answer, the one definition of a
    # skipped step (not stepped: fp16's scaler skipped an overflow, or `dropped`)
    dropped: bool = False  # `check` found the step bad: gradients dropped, nothing stepped


def micro_steps(model: nn.Module, acc: Accumulator, batches: Iterator, precision: Precision,
                between: Callable[[], object] | None = None) -> torch.Tensor:
    """Forward and backward over one accumulation window; returns the mean local loss.
    `between()`: called between two micro-steps (the planner's memory tracker clears its
    per-module records there: it refuses a module run twice)."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for i in range(acc.steps):
        if i and between is not None:
            between()
        with acc.micro_step():  # under the run's precision (autocast)
            with record_function("phalanx::data"):
                x, y = next(batches)
                slow_point("data")  # (PHALANX_FAULT's action=slow,where=data; else nothing)
            with record_function("phalanx::forward"):
                _, loss = model(x, y)
            with record_function("phalanx::backward"):
                acc.backward(loss, precision.scaler)
        total += loss.detach().float()
    return total / acc.steps


def pipeline_steps(run: Run, model: nn.Module, batches: Iterator, microbatches: int,
                   schedule: str) -> torch.Tensor:
    """Under pipeline stages (`--pp`): the accumulation window's micro-batches — the ones
    `micro_steps` would read — through the schedule as one batch (`run.forward_backward`);
    returns their mean loss, on every rank."""
    with record_function("phalanx::data"):
        pairs = [next(batches) for _ in range(microbatches)]
        slow_point("data")
    with record_function("phalanx::forward_backward"):
        return run.forward_backward(model, torch.cat([x for x, _ in pairs]),
                                    torch.cat([y for _, y in pairs]),
                                    microbatches=microbatches, schedule=schedule)


def optimizer_step(run: Run, model: nn.Module, opt: torch.optim.Optimizer, grad_clip: float,
                   check: Callable[[torch.Tensor | None], bool] | None = None) -> StepOutcome:
    """The public path, `run.clip_grad_norm_` then `run.step`: unscale (fp16) → clip (the
    strategy's: the global norm, sharded or not) → step → zero, in that order. Returns
    the gradient norm before clipping and whether the parameters moved. Either way it
    counts one optimizer step (`run.optimizer_steps`).

    `check(norm)` (the NaN guard) is asked before stepping; when it says the step is bad
    the gradients are dropped and nothing steps (`dropped`). Under fp16 it is not asked:
    the scaler skips such steps itself (`stepped` False, not `dropped`)."""
    assert run.precision is not None  # set by run.setup
    scaler = run.precision.scaler
    with record_function("phalanx::optimizer"):  # (the profiler's label: runtime.profiling)
        norm = run.clip_grad_norm_(model, grad_clip, opt) if grad_clip > 0 else None
        if check is not None and scaler is None and check(norm):
            run.optimizer_steps += 1  # counted as `run.step` counts it
            opt.zero_grad(set_to_none=True)
            run.step_ended()
            return StepOutcome(norm, stepped=False, dropped=True)
        return StepOutcome(norm, stepped=run.step(opt))
