"""Pipeline parallelism (`pp`): the model split by blocks into consecutive stages, one a
pipeline rank, run by torch's schedules (`torch.distributed.pipelining`: GPipe, 1F1B).
FSDP2 and tensor parallelism work inside a stage, on the stage's own modules.

A stage keeps its modules' whole-model names (the model's `keep_stage`, as torchtitan
builds the whole model and drops what a stage does not own), so its state dict is its part
of the whole model's and DCP reshards a checkpoint between pp and other layouts.

One step: the data-parallel rank's batch (micro-batch size × micro-batches rows) goes in
on the first stage, its targets on the last; the schedule splits both into micro-batches,
and scales the gradients by 1 / micro-batches, so the step's gradient is that of the
batch's mean loss — what one process computes on it. The loss exists on the last stage
only; `forward_backward` hands every rank of the pipeline its mean (one all-reduce).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F

from phalanx.config.layout import SCHEDULES, pipeline_refusal
from phalanx.errors import UserError


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy of a micro-batch (the last stage's loss)."""
    full = getattr(logits, "full_tensor", None)  # (a head split by tensor parallelism)
    logits = full() if callable(full) else logits
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


class Pipeline:
    """This rank's stage of `model` in the pipeline over `group` (its stage: the rank in
    the group), and the schedule that runs it."""

    def __init__(self, model: nn.Module, group: Any, device: torch.device, *,
                 schedule: str = "1f1b", microbatches: int, loss_fn=token_loss) -> None:
        from torch.distributed import pipelining

        if schedule not in SCHEDULES:
            raise UserError(f"--pp-schedule {schedule!r} is not one of "
                            f"{', '.join(SCHEDULES)}.")
        self.group, self.stages = group, dist.get_world_size(group)
        self.stage_index = dist.get_rank(group)
        self.first, self.last = self.stage_index == 0, self.stage_index == self.stages - 1
        self.stage = pipelining.PipelineStage(model, self.stage_index, self.stages, device,
                                              group=group)
        kind = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule]
        self.schedule = kind(self.stage, n_microbatches=microbatches, loss_fn=loss_fn,
                             scale_grads=True)
        self.device = device

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and backward of the batch (`x` ids, `y` targets: every stage passes
        them; the first uses `x`, the last `y`); the mean loss over its micro-batches, on
        every rank of the pipeline."""
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        self.schedule.step(*args, target=y if self.last else None,
                           losses=losses if self.last else None)
        total = (torch.stack([loss.detach().float() for loss in losses]).mean()
                 if losses else torch.zeros((), device=self.device))
        dist.all_reduce(total, group=self.group)  # (only the last stage's is not zero)
        return total


def pipeline_norm(local: torch.Tensor, group: Any) -> torch.Tensor:
    """The gradient norm over every stage, from each stage's own (`local`: over its
    parameters, already combined over the data-parallel and tensor-parallel meshes)."""
    squared = local.detach().float() ** 2
    dist.all_reduce(squared, group=group)
    return squared.sqrt()


def check_pipeline(model: nn.Module, pp: int, schedule: str, microbatches: int) -> None:
    """A model that can be cut into `pp` stages: it has `keep_stage` (MiniGPT's), enough
    blocks, no weight tied across stages; and a schedule and micro-batch count torch's
    schedules take."""
    if not callable(getattr(model, "keep_stage", None)):
        raise UserError(f"`--pp {pp}`: {type(model).__name__} cannot be cut into pipeline "
                        f"stages here (Phalanx cuts MiniGPT by its blocks; a model of "
                        f"yours needs a `keep_stage(stage, stages)` method, as MiniGPT's).")
    config = getattr(model, "config", None)
    refusal = pipeline_refusal(getattr(config, "n_layer", pp), pp, schedule, microbatches,
                               bool(getattr(config, "tie_embeddings", False)))
    if refusal is not None:
        raise UserError(f"`--pp {pp}`: {refusal}.")
