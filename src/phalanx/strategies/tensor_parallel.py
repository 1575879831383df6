"""Tensor parallelism inside FSDP2 (`--tp T`): each block's matrices split over the T
consecutive ranks of a tensor-parallel group with torch's `parallelize_module`, before
`fully_shard` shards (and replicates) what every rank holds over the other mesh
dimensions — torchtitan's order, on one DeviceMesh (`Topology.tp_mesh`, `dp_mesh`).

The plan comes from the model: a `tp_plan()` method returning {module name: torch
ParallelStyle} (MiniGPT's: `models.minigpt.MiniGPT.tp_plan`), and optionally
`tp_refusal(tp)`, a reason the model cannot be split over `tp` ranks. A model without a
plan is refused in one line, as is a plan naming a module the model does not have.

Gradient clipping and the non-finite checks see gradients on two meshes (the split
matrices' on (dp, tp), the rest's on dp alone), which torch's `clip_grad_norm_` refuses:
`total_norm` combines one norm per mesh.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn as nn

from phalanx.errors import UserError


def split(model: nn.Module, tp_mesh: Any) -> nn.Module:
    """`model` with its plan applied over `tp_mesh` (in place; the model returned)."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    plan_of = getattr(model, "tp_plan", None)
    if not callable(plan_of):
        raise UserError(f"`--tp {tp}`: {type(model).__name__} has no tensor-parallel plan. "
                        f"Give it a `tp_plan()` method returning {{module name: torch "
                        f"ParallelStyle}} (docs/parallelism.md), or leave --tp out.")
    refusal = getattr(model, "tp_refusal", None)
    why = refusal(tp) if callable(refusal) else None
    if why:
        raise UserError(f"`--tp {tp}`: {why}. Choose a --tp that fits, or leave it out.")
    plan = plan_of()
    names = {name for name, _ in model.named_modules()}
    unknown = sorted(set(plan) - names)
    if unknown:
        raise UserError(f"`--tp {tp}`: the tensor-parallel plan names `{unknown[0]}`, which "
                        f"{type(model).__name__} does not have. Name its modules as "
                        f"model.named_modules() does.")
    # (DTensor warns, once per shape, that a norm over two mesh dimensions takes two
    # all-reduces: true, small, and not the user's to act on)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    return parallelize_module(model, tp_mesh, plan)


def clip(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch's `clip_grad_norm_` over parameters whose gradients may live on different
    meshes: the total norm (`total_norm`), then each mesh's gradients scaled by torch's
    `clip_grads_with_norm_`. Returns the norm before clipping, the same on every rank."""
    with_grad = [p for p in params if p.grad is not None]
    total = total_norm([p.grad for p in with_grad if p.grad is not None])
    for group in _by_mesh(with_grad, lambda p: p.grad).values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def _by_mesh(items: list, tensor_of=lambda t: t) -> dict[Any, list]:
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list] = {}
    for item in items:
        t = tensor_of(item)
        groups.setdefault(t.device_mesh if isinstance(t, DTensor) else None, []).append(item)
    return groups


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm over every gradient, whatever mesh each lives on: one norm per mesh
    (torch's, one collective each), combined. A plain tensor, the same on every rank."""
    from torch.distributed.tensor import DTensor

    parts = []
    for group in _by_mesh(grads).values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        parts.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not parts:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(parts)) if len(parts) > 1 else parts[0]
