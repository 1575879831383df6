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

import functools
import inspect
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn import functional as F

from phalanx.config.layout import schedule_refusal, stage_refusal
from phalanx.errors import UserError
from phalanx.models.minigpt import whole


@functools.cache
def drops_outputs() -> bool:
    """Whether torch's schedules can be told not to keep the last stage's outputs
    (`step(return_outputs=False)`, newer torch); with it the last stage holds a
    micro-batch's logits only until its backward (plan.pipeline counts either way).
    Asked once per process (it inspects a signature)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    return "return_outputs" in inspect.signature(PipelineScheduleSingle.step).parameters


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The mean next-token cross-entropy of a micro-batch (the last stage's loss)."""
    return F.cross_entropy(whole(logits).float().flatten(0, 1), targets.flatten())


class Pipeline:
    """This rank's stage of `model` in the pipeline over `group` (its stage: the rank in
    the group), and the schedule that runs it. `forward_only`: for `evaluate` alone (GPipe
    runs fewer micro-batches than stages there; training refuses that idle pipeline)."""

    def __init__(self, model: nn.Module, group: Any, device: torch.device, *,
                 schedule: str = "1f1b", microbatches: int, loss_fn=token_loss,
                 forward_only: bool = False) -> None:
        from torch.distributed import pipelining

        self.group, self.stages = group, dist.get_world_size(group)
        refusal = schedule_refusal(self.stages, schedule,
                                   self.stages if forward_only else microbatches)
        if refusal is not None:
            raise UserError(f"pipeline of {self.stages} stages: {refusal}.")
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
        step = self.schedule.step
        if drops_outputs():  # (the last stage would keep every micro-batch's logits to the
            # step's end, then merge them: a second copy; nobody reads them)
            step = functools.partial(step, return_outputs=False)
        return self._mean_loss(step, x, y)

    def evaluate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The batch's mean loss, forward only (the schedule's `eval`), on every rank of
        the pipeline."""
        forward_only = getattr(self.schedule, "eval", None)
        if forward_only is None:
            raise UserError(f"evaluation under pipeline stages needs a torch whose schedules "
                            f"have `eval()` (this is torch {torch.__version__}); upgrade "
                            f"torch, or train without --pp.")
        return self._mean_loss(forward_only, x, y)

    def _mean_loss(self, schedule_call, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        args = (x,) if self.first else ()
        schedule_call(*args, target=y if self.last else None, losses=losses if self.last else None)
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


def cut(model: nn.Module, pp_mesh: Any) -> None:
    """`model` (rank 0's weights on every rank; `check_setup` found it can be cut) cut to
    this rank's stage of the pipeline over `pp_mesh`."""
    model.keep_stage(pp_mesh.get_local_rank(), pp_mesh.size())  # type: ignore[operator]


def check_stages(model: nn.Module, pp: int) -> None:
    """A model that can be cut into `pp` stages: it has `keep_stage` (MiniGPT's), enough
    blocks, no weight tied across stages."""
    if not callable(getattr(model, "keep_stage", None)):
        raise UserError(f"`--pp {pp}`: {type(model).__name__} cannot be cut into pipeline "
                        f"stages here (Phalanx cuts MiniGPT by its blocks; a model of "
                        f"yours needs a `keep_stage(stage, stages)` method, as MiniGPT's).")
    config = getattr(model, "config", None)
    refusal = stage_refusal(getattr(config, "n_layer", pp), pp,
                            bool(getattr(config, "tie_embeddings", False)))
    if refusal is not None:
        raise UserError(f"`--pp {pp}`: {refusal}.")


def check_setup(model: nn.Module, pp: int, meta: bool, precision: str) -> None:
    """What this version does not build under pipeline stages, refused at setup in one
    line: a model built on the meta device (each stage would need its own part of rank
    0's initialisation), and low precision (a loss scale and autocast across stages)."""
    check_stages(model, pp)
    if meta:
        raise UserError(f"`--pp {pp}`: a model built on the meta device is not cut into "
                        f"pipeline stages yet; build it on the CPU (each rank keeps its "
                        f"stage's part of rank 0's weights).")
    if precision != "fp32":
        raise UserError(f"`--pp {pp}` with precision {precision}: pipeline stages train in "
                        f"fp32 in this version; leave the precision at fp32.")


def kept(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The blocks a script named (`run.setup(blocks=)`) that this stage kept."""
    mine = {id(m) for m in model.modules()}
    return [b for b in blocks if id(b) in mine]


def whole_state(model: nn.Module, topology: Any) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 ({} elsewhere): each stage's gathered inside it
    (every rank of the stage calls it), then the stages' sent to rank 0 over its pipeline
    (the other pipelines, of other data-parallel and tensor-parallel coordinates, take
    part in nothing more)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    own = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    pp_mesh = topology.pp_mesh
    if any(topology.mesh[d].get_local_rank() for d in ("dp_replicate", "dp_shard", "tp")):
        return {}
    parts: list[Any] = [None] * pp_mesh.size() if topology.is_main else []
    own = {k: cast(torch.Tensor, v).detach().cpu() for k, v in own.items()}
    group = pp_mesh.get_group()
    dist.gather_object(own, parts if topology.is_main else None,
                       dst=dist.get_global_rank(group, 0), group=group)
    return {k: v for part in parts for k, v in part.items()} if topology.is_main else {}


def stage_note(model: nn.Module, pp: int) -> str:
    """E.g. "pipeline: 2 stages by blocks, this rank's stage 0 (blocks 0-1)"."""
    stage = (getattr(model, "stage", None) or (0, pp))[0]
    blocks = getattr(model, "blocks", None)
    held = list(blocks.keys()) if isinstance(blocks, nn.ModuleDict) else []
    return (f"pipeline: {pp} stages by blocks, this rank's stage {stage}"
            + (f" (blocks {held[0]}-{held[-1]})" if held else ""))
