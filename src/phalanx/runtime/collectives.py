"""`Run`'s collectives on plain numbers: a mean or sum of a value over the ranks
(`all_reduce`), one number the ranks agree on (`agree`: max, min or sum, read on the host)
rank `src`'s object on every rank (`broadcast`), every rank's
object on every rank (`gather_objects`) and a barrier. Each is a collective: call it on every rank.
Each is timed as a wait (`waiting`: the straggler check's, runtime.pace)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

AGREE_OPS = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "sum": dist.ReduceOp.SUM}


class CollectiveMethods:
    """Mixed into `Run`: needs its `device` and `world_size`."""

    device: torch.device
    world_size: int
    pace: Any

    def waiting(self) -> contextlib.AbstractContextManager:
        """A block that waits for the other ranks (a collective): not this rank's own time
        in the straggler check (runtime.pace)."""
        return self.pace.waiting() if self.pace is not None else contextlib.nullcontext()

    def all_reduce(self, value: float | torch.Tensor, op: str = "mean"):
        """Sum or mean of `value` over all ranks; a float in, a float out."""
        if op not in ("mean", "sum"):
            raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
        is_tensor = isinstance(value, torch.Tensor)
        t = (value.detach().clone() if isinstance(value, torch.Tensor) else
             torch.tensor(value, dtype=torch.float64)).to(self.device)
        with self.waiting():
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        if op == "mean":
            t = t / self.world_size
        return t if is_tensor else t.item()

    def agree(self, value: float | bool | torch.Tensor, op: str = "max") -> float:
        """`value` (a number or 1-element tensor) reduced by "max", "min" or "sum" over the
        ranks in one all-reduce (none at world size 1), read on the host: a collective."""
        if op not in AGREE_OPS:
            raise ValueError(f"op must be one of {', '.join(AGREE_OPS)}, got {op!r}")
        t = torch.as_tensor(value).detach().to(self.device, torch.float64).reshape(1)
        if self.world_size > 1:
            with self.waiting():
                dist.all_reduce(t, op=AGREE_OPS[op])
        return t.item()

    def all_reduce_mean(self, value: float | torch.Tensor):
        return self.all_reduce(value, "mean")

    def all_reduce_sum(self, value: float | torch.Tensor):
        return self.all_reduce(value, "sum")

    def barrier(self) -> None:
        with self.waiting():
            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s (picklable) object, on every rank."""
        box = [obj]
        with self.waiting():
            dist.broadcast_object_list(box, src=src)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's (picklable) `obj`, in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        with self.waiting():
            dist.all_gather_object(out, obj)
        return out
