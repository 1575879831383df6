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
    _pipelines: Any  # model → ((schedule, micro-batches, loss), its Pipeline): a weak map

    def forward_backward(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, *,
                         microbatches: int = 1, schedule: str = "1f1b",
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = token_loss
                         ) -> torch.Tensor:
        """Forward and backward of the batch `x` (inputs) / `y` (targets), cut into
        `microbatches` micro-batches (their row count must divide evenly); `schedule`
        ("1f1b" or "gpipe") under pipeline stages. Returns the batch's mean loss."""
        if microbatches < 1 or x.size(0) % microbatches:
            raise UserError(f"run.forward_backward: a batch of {x.size(0)} rows does not cut "
                            f"into {microbatches} equal micro-batches; pass a micro-batch "
                            f"count that divides it.")
        pp_mesh = self.topology.pp_mesh
        if pp_mesh is not None:
            return self._pipeline(model, pp_mesh, schedule, microbatches, loss_fn) \
                .forward_backward(x, y)
        acc = self.accumulate(model, microbatches)
        total = torch.zeros((), device=x.device)
        for xs, ys in zip(x.chunk(microbatches), y.chunk(microbatches)):
            with acc.micro_step():
                out = model(xs)
                loss = loss_fn(out[0] if isinstance(out, tuple) else out, ys)
                acc.backward(loss)
            total += loss.detach().float()
        return total / microbatches

    def _pipeline(self, model: nn.Module, pp_mesh: Any, schedule: str, microbatches: int,
                  loss_fn) -> Pipeline:
        """The model's schedule, made at its first step (again if the step's micro-batch
        count, schedule or loss changed); the step's RNG seeded as micro-step 0's."""
        made = self._pipelines.get(model)
        if made is None or made[0] != (schedule, microbatches, loss_fn):
            pipe = Pipeline(model, pp_mesh.get_group(), self.topology.device,
                            schedule=schedule, microbatches=microbatches, loss_fn=loss_fn)
            made = ((schedule, microbatches, loss_fn), pipe)
            self._pipelines[model] = made
        self._seed_micro_step(0)
        return made[1]
