"""A non-finite loss or gradient on any rank, seen by every rank at the same step.

Each optimizer step, the ranks all-reduce one small vector — a flag per rank for its own
loss, and one for the (global) gradient norm, which is known when clipping (`--grad-clip`
> 0, the default) — so that they agree on the verdict at the
same step without another rank's word. On a bad step every rank drops its gradients and
does not step: the replicas stay identical and the batch is passed over. `--on-nan
rollback` then also reloads the newest committed checkpoint on every rank (the data goes
on past the offending batch; before the first checkpoint it only skips), which recovers
even when an earlier update already made the weights non-finite; a fourth rollback to the
same checkpoint stops the run. `--on-nan stop` ends
the run there instead; `--nan-patience N` bad steps in a row end it too. The
message names the ranks whose loss was not finite and the first parameter (in the
model's order) whose gradient was not finite.
"""

from __future__ import annotations

import torch

from phalanx.report.events import warn
from phalanx.strategies.tensors import local_tensor, user_name

MAX_ROLLBACKS = 3  # to the same checkpoint: then the run stops


class NanGuard:
    def __init__(self, run, mode: str, patience: int, precision: str = "fp32",
                 out_dir=None) -> None:
        self.run, self.mode, self.patience, self.precision = run, mode, patience, precision
        self.out_dir = out_dir  # where rank 0 records the events (phalanx.report.events)
        self.skipped = 0  # in all
        self.rollbacks: dict[int, int] = {}  # checkpoint step -> rollbacks to it
        self.in_a_row = 0
        self.first_bad_step: int | None = None

    def bad(self, loss: torch.Tensor, norm: torch.Tensor | None) -> list[int] | None:
        """None when every rank's loss and the gradient norm are finite; else the ranks
        whose loss was not (possibly empty: then the gradients alone were not). The flags
        are made on the device and read back once: one host sync per step."""
        run = self.run
        flags = torch.zeros(run.world_size + 1, dtype=torch.float32, device=run.device)
        flags[run.rank] = (~torch.isfinite(loss.detach())).any().float()
        if norm is not None:
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            flags[-1] = (~torch.isfinite(torch.as_tensor(norm, device=run.device))).any()
        if run.world_size > 1:
            import torch.distributed as dist

            with run.waiting():
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        seen = flags.tolist()
        if not any(seen):
            self.in_a_row = 0
            return None
        return [r for r in range(run.world_size) if seen[r] > 0]

    def message(self, step: int, ranks: list[int], model) -> str:
        """`step 7: the loss of rank 1 is not finite (first non-finite gradient:
        wte.weight)` — asked of every rank (the parameter may be on another's shard)."""
        names = self.run.gather_objects(first_non_finite(model))
        name = next((n for n in names if n), None)
        who = f"the loss of rank {', '.join(map(str, ranks))} is not finite" if ranks \
            else "the gradient norm is not finite"
        where = f" (first non-finite gradient: {name})" if name else ""
        return f"step {step}: {who}{where}"

    def record(self, step: int) -> str | None:
        """Count a skipped step; the reason to stop now, if any."""
        self.skipped += 1
        self.in_a_row += 1
        if self.first_bad_step is None:
            self.first_bad_step = step
        if self.mode == "stop":
            return f"stopped (--on-nan stop): {advice(self.precision)}."
        if self.in_a_row >= self.patience:
            return (f"{self.in_a_row} steps in a row were not finite (--nan-patience "
                    f"{self.patience}); the run diverged: {advice(self.precision)}.")
        return None


    def rolled_back_to(self, step: int) -> str | None:
        """Count a rollback to the checkpoint of `step`; the reason to stop, if any."""
        self.rollbacks[step] = self.rollbacks.get(step, 0) + 1
        if self.rollbacks[step] > MAX_ROLLBACKS:
            return (f"{MAX_ROLLBACKS} rollbacks to the checkpoint of step {step} did not get "
                    f"the run past it (the cause is not one batch); {advice(self.precision)}.")
        return None

    def note(self, step: int, kind: str, text: str) -> None:
        """Say `text` on rank 0 and record it in the run's events."""

        warn(self.run, self.out_dir, kind, step, text)


def advice(precision: str) -> str:
    fix = "lower --lr, or set --grad-clip (e.g. 1.0)"
    return fix + (", or train in bf16/fp32 rather than fp16" if precision == "fp16" else "")


def parameters_finite(run, model) -> bool:
    """Every rank's parameters (its shards, under FSDP) are finite — one all-reduce,
    one host sync."""
    local = [torch.isfinite(local_tensor(p)).all() for p in model.parameters()]
    return not run.agree(~torch.stack(local).all(), "max")


def first_non_finite(model) -> str | None:
    """The first parameter (in `named_parameters` order) whose local gradient is not
    finite on this rank."""
    for name, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        if not bool(torch.isfinite(local_tensor(g)).all()):
            return user_name(name)
    return None
