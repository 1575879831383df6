"""`run.forward_backward(model, x, y, microbatches=M)`: one optimizer step's forward and
backward of a batch, the same call under every layout — the loop a script writes once.

Without pipeline stages it is `run.accumulate`'s micro-steps over the batch cut in M
(gradients synchronised on the last); with them (`--pp`) the pipeline schedule runs the
M micro-batches through the stages (`strategies.pipeline`), the ids going in on the first
stage and the targets on the last. Either way the gradients are those of the batch's mean
loss, and the call returns that mean loss on every rank (a pipeline's last stage holds it
and hands it on). The model's forward takes `x` and returns logits (or `(logits, ...)`);
`loss_fn(logits, y)` (default: next-token cross-entropy) makes a micro-batch's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from phalanx.errors import UserError
from phalanx.strategies.pipeline import Pipeline, token_loss


class ForwardBackwardMethods:
    """Mixed into `Run` (which provides topology, strategy, accumulate, `optimizer_steps`
    and `_seed_micro_step`)."""

    topology: Any
    accumulate: Any
    _seed_micro_step: Any
    _pipelines: Any  # model → {(schedule, micro-batches, loss, eval): Pipeline}: a weak map

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                         microbatches: int = 1, schedule: str = "1f1b",
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = token_loss
                         ) -> torch.Tensor:
        """Forward and backward of the batch `x` (inputs) / `y` (targets), cut into
        `microbatches` micro-batches (their row count must divide evenly); `schedule`
        ("1f1b" or "gpipe") under pipeline stages. Returns the batch's mean loss."""
        _check_cut(x, microbatches, "forward_backward")
        pp_mesh = self.topology.pp_mesh
        if pp_mesh is not None:
            self._seed_micro_step(0)  # (the step's RNG: micro-step 0's, as accumulation's)
            return self._pipeline(model, pp_mesh, schedule, microbatches, loss_fn) \
                .forward_backward(x, y)
        acc = self.accumulate(model, microbatches)
        total = torch.zeros((), device=x.device)
        for xs, ys in zip(x.chunk(microbatches), y.chunk(microbatches)):
            with acc.micro_step():
                loss = loss_fn(_logits(model(xs)), ys)
                acc.backward(loss)
            total += loss.detach().float()
        return total / microbatches

    @torch.no_grad()
    def eval_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                  microbatches: int = 1,
                  loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = token_loss
                  ) -> torch.Tensor:
        """The batch's mean loss without gradients, the same call under every layout (with
        pipeline stages: the GPipe schedule's forward-only `eval`), on every rank. Put the
        model in eval mode first, as for any evaluation."""
        _check_cut(x, microbatches, "eval_loss")
        pp_mesh = self.topology.pp_mesh
        if pp_mesh is not None:
            return self._pipeline(model, pp_mesh, "gpipe", microbatches, loss_fn,
                                  evaluation=True).evaluate(x, y)
        losses = [loss_fn(_logits(model(xs)), ys).float()
                  for xs, ys in zip(x.chunk(microbatches), y.chunk(microbatches))]
        return torch.stack(losses).mean()

    def _pipeline(self, model: nn.Module, pp_mesh: Any, schedule: str, microbatches: int,
                  loss_fn, evaluation: bool = False) -> Pipeline:
        """The model's schedule for these micro-batches, schedule and loss, made at its
        first use (training and evaluation keep one each)."""
        made = self._pipelines.setdefault(model, {})
        key = (schedule, microbatches, loss_fn, evaluation)
        if key not in made:
            made[key] = Pipeline(model, pp_mesh.get_group(), self.topology.device,
                                 schedule=schedule, microbatches=microbatches, loss_fn=loss_fn,
                                 forward_only=evaluation)
        return made[key]


def _logits(out: Any) -> torch.Tensor:
    """A forward's logits: the output, or its first element (`(logits, ...)`)."""
    return out[0] if isinstance(out, tuple) else out


def _check_cut(x: torch.Tensor, microbatches: int, call: str) -> None:
    if microbatches < 1 or x.size(0) % microbatches:
        raise UserError(f"run.{call}: a batch of {x.size(0)} rows does not cut into "
                        f"{microbatches} equal micro-batches; pass a micro-batch count that "
                        f"divides it.")
