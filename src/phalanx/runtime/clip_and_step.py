"""`Run`'s optimizer-step methods: the global gradient clip and the step, right under
every precision — fp16 unscales before the clip and steps through the loss scaler, so a
user's loop never calls `unscale_`, `scaler.step` or `scaler.update` itself — and the
seeding of randomness from the steps taken.

Seeding: `run.accumulate`'s every micro-step seeds torch's RNG from (seed, optimizer step,
micro-step, data-parallel rank) — `SEEDING`, recorded in each checkpoint — where the
optimizer step is what `run.step` counts (`optimizer_steps`) and `run.resume` restores.
So the micro-batches of one step draw their own dropout masks, every rank its own, and a
resumed loop draws what an uninterrupted one would. A loop without `accumulate` seeds at
the top of each step with `run.seed_step(step)`, from (seed, step, rank).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.nn as nn

from phalanx.errors import UserError
from phalanx.report.events import warn

SEEDING = "(seed, optimizer step, micro-step, data-parallel rank)"  # see the docstring


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers such as (seed, step, rank), stable across runs."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class StepMethods:
    """Mixed into `Run` (which provides strategy, precision, seed, topology, the
    optimizers `setup` built, by model, and the counter `optimizer_steps`)."""

    strategy: Any
    precision: Any
    seed: int
    topology: Any
    optimizer_steps: int
    _seed_rank: int | None
    _optimizers: Any
    pace: Any
    out: Any
    waiting: Any

    @property
    def loss_scaler(self) -> Any:
        """The fp16 loss scaler `setup` made (None in fp32 and bf16, and before `setup`)."""
        return self.precision.scaler if self.precision is not None else None

    def seed_step(self, step: int, rank: int | None = None) -> None:
        """Seed torch's RNG from (seed, step, rank) at the top of a step, for a loop
        without `run.accumulate` (whose micro-steps seed themselves). `rank`: the
        data-parallel rank to seed with when it is not this process's (a torchft replica
        group's place in this step's quorum); the ranks of a tensor-parallel group share
        theirs, so they draw the same dropout masks on replicated activations."""
        rank = self.topology.dp_rank if rank is None else rank
        torch.manual_seed(derive_seed(self.seed, step, rank))

    def at_step(self, step: int, rank: int | None = None) -> None:
        """Set the optimizer step the next micro-steps belong to, for a loop that keeps
        its own count (the trainer: after a rollback, a torchft heal, a retried step);
        `rank`: the data-parallel rank they seed with when it is not this process's (a
        torchft replica group's place in the step's quorum; None: the topology's)."""
        self.optimizer_steps, self._seed_rank = step, rank

    def _seed_micro_step(self, micro: int) -> None:
        """Seed torch's RNG for micro-step `micro` of the coming optimizer step (`SEEDING`;
        `run.accumulate`'s `micro_step()` calls it)."""
        rank = self.topology.dp_rank if self._seed_rank is None else self._seed_rank
        torch.manual_seed(derive_seed(self.seed, self.optimizer_steps, micro, rank))

    def clip_grad_norm_(self, model: nn.Module, max_norm: float,
                        optimizer: torch.optim.Optimizer | None = None) -> torch.Tensor:
        """Clip the global gradient norm to `max_norm` (over every rank's gradients,
        sharded or not); returns the norm before clipping, equal on every rank. Under
        fp16 the gradients are unscaled first (the optimizer `setup` built, or
        `optimizer`), so the norm and the clip are in true units."""
        scaler = self.loss_scaler
        if scaler is not None:
            opt = self._fp16_optimizer(model, optimizer)
            if _stage(scaler, opt) != "unscaled":
                scaler.unscale_(opt)
        with self.waiting():  # (a sharded norm is all-reduced)
            return self.strategy.clip_grad_norm_(model, max_norm)

    def step(self, optimizer: torch.optim.Optimizer, *, zero_grad: bool = True) -> bool:
        """The optimizer step at an accumulation boundary: under fp16 through the loss
        scaler (unscaled if `clip_grad_norm_` did not already, skipped when a gradient
        is inf/NaN, the scale updated); then the gradients are zeroed (set to None).
        Returns whether the parameters were stepped (False: fp16 skipped an overflow).
        Either way it counts one optimizer step (`optimizer_steps`: what the next
        micro-steps seed from)."""
        scaler = self.loss_scaler
        stepped = True
        self.optimizer_steps += 1
        if scaler is None:
            optimizer.step()
        else:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            stepped = scaler.get_scale() >= before  # the scale shrinks on a skipped step
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        self.step_ended()
        return stepped

    def step_ended(self) -> None:
        """The end of an optimizer step (`step` calls it; a loop that drops a step without
        `step` calls it too): the step's pace, and every `--straggler-every` steps the
        straggler check (a collective: every rank ends its steps alike)."""
        if self.pace is None:
            return
        self.pace.stepped()
        said = self.pace.check(self.optimizer_steps)
        if said:
            warn(self, self.pace.events_dir or self.out, "straggler", self.optimizer_steps,
                 said)

    def _fp16_optimizer(self, model: nn.Module,
                        given: torch.optim.Optimizer | None) -> torch.optim.Optimizer:
        found = given if given is not None else self._optimizers.get(model)
        if found is None:
            raise UserError("run.clip_grad_norm_ under fp16 must unscale the gradients "
                            "first, and no optimizer is known for this model: pass it to "
                            "run.setup(model, optimizer, ...) or to "
                            "run.clip_grad_norm_(model, max_norm, optimizer=opt).")
        return found


def _stage(scaler: Any, optimizer: torch.optim.Optimizer) -> str:
    """The loss scaler's stage for `optimizer` ("ready", "unscaled", "stepped")."""
    state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer))
    stage = state.get("stage") if state else None
    return getattr(stage, "name", "READY").lower()
