"""DistributedDataParallel: one replica per rank, gradients all-reduced during backward.

DDP broadcasts rank 0's parameters and buffers to every rank when it is constructed,
so replicas start identical even if each rank initialised its model differently.
Gradients are averaged in buckets (`bucket_cap_mb`) overlapped with backward.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from phalanx.config.strategy import DDPOptions
from phalanx.errors import DistributedError, UserError
from phalanx.strategies.base import Alternative, BackwardSyncControl, Strategy

_UNUSED = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")


class PhalanxDDP(DistributedDataParallel):
    """DDP whose unused-parameter error names the parameters instead of their indices,
    and that counts the forward passes that prepared a synchronising backward."""

    synced_forwards = 0
    _phalanx_waiting: Callable[[], AbstractContextManager] = nullcontext  # Strategy.time_waits

    def _sync_buffers(self):  # (torch's: the buffers' broadcast before the forward)
        with self._phalanx_waiting():
            return super()._sync_buffers()

    def forward(self, *inputs, **kwargs):
        if torch.is_grad_enabled() and self.require_backward_grad_sync:
            self.synced_forwards += 1
        try:
            return super().forward(*inputs, **kwargs)
        except RuntimeError as exc:
            found = _UNUSED.search(str(exc))
            if found is None:
                raise
            raise DistributedError(unused_message(self.module, found), [int(found[1])]) from exc


def unused_message(module: nn.Module, found: re.Match) -> str:
    trainable = [name for name, p in module.named_parameters() if p.requires_grad]
    names = [trainable[int(i)] for i in found[2].split() if int(i) < len(trainable)]
    return (f"these parameters received no gradient in the previous step: {', '.join(names)}. "
            f"DDP expects every parameter to take part in the loss. Make forward use them, "
            f"freeze them (`requires_grad_(False)`) before setup, or pass "
            f"`--find-unused-parameters` (costs a graph traversal every step).")


class DDPStrategy(Strategy, BackwardSyncControl):
    name = "ddp"

    def __init__(self, topology, options=None) -> None:
        super().__init__(topology, options)
        self._wrapped: weakref.WeakSet = weakref.WeakSet()

    def start_from_rank0(self, model: nn.Module) -> None:
        """Nothing before wrapping: DDP's constructor broadcasts rank 0's parameters and
        buffers over its own process group (which may be a subgroup: bench --scaling) and
        checks that every rank's parameters have the same shapes."""

    def prepare(self, model: nn.Module) -> nn.Module:
        """SyncBatchNorm when asked (CUDA only: `check` refuses it elsewhere)."""
        if not self.options.sync_batchnorm:
            return model
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def wrap(self, model: nn.Module) -> nn.Module:
        device, o = self.topology.device, self.options
        wrapped = PhalanxDDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=o.bucket_cap_mb,
            gradient_as_bucket_view=o.gradient_as_bucket_view,
            static_graph=o.static_graph,
            find_unused_parameters=o.find_unused_parameters,
            process_group=o.process_group or _unverified_group(),
        )
        self._wrapped.add(wrapped)
        self.note = tuning_note(self.name, wrapped)
        return wrapped

    def time_waits(self, model: nn.Module, waiting: Callable[[], AbstractContextManager]) -> None:
        """DDP broadcasts a model's buffers before each forward: a wait."""
        if isinstance(model, PhalanxDDP):
            model._phalanx_waiting = waiting

    def alternatives(self) -> list[Alternative]:
        """Phalanx's DDP settings that torch's DDP does not use unless told."""
        o, found = self.options, []
        if o.static_graph:
            found.append(Alternative("DDP static_graph", "True", "False", {"static_graph": False}))
        if o.gradient_as_bucket_view:
            found.append(Alternative("DDP gradient_as_bucket_view", "True", "False",
                                     {"gradient_as_bucket_view": False}))
        found.append(Alternative("DDP bucket sizes", f"{o.bucket_cap_mb:g} MiB, every bucket",
                                 "25 MiB, the first 1 MiB", {"bucket_cap_mb": None}))
        return found

    def release(self) -> None:
        """Drop each DDP wrapper's reducer, logger and group, so that the process group
        is destroyed by `destroy_process_group` rather than whenever the wrapper is
        freed (see Run._quiesce). The wrappers' inner modules stay usable."""
        for wrapped in list(self._wrapped):
            for name in ("reducer", "logger", "process_group"):
                wrapped.__dict__.pop(name, None)
        self._wrapped.clear()

    def no_backward_sync(self, model: nn.Module, enabled: bool) -> AbstractContextManager:
        if not isinstance(model, DistributedDataParallel):
            raise UserError("no_backward_sync() needs the module returned by run.setup(), "
                            f"got a plain {type(model).__name__}.")
        # torch 2.13: with static_graph, a no_sync micro-step before the first
        # synchronised iteration trips "expect_autograd_hooks_ INTERNAL ASSERT". Syncing
        # those micro-steps instead gives the same result (the all-reduce is linear), so
        # the first accumulation window simply synchronises every micro-step.
        if model.static_graph and getattr(model, "synced_forwards", 0) == 0:
            return nullcontext()
        return model.no_sync() if enabled else nullcontext()


def tuning_note(name: str, ddp: DistributedDataParallel) -> str:
    """The tuning a user gave DDP (bucket size, gradient views, the unused-parameter
    search) where it differs from the defaults, read back from torch's DDP so that a
    run's output shows it took effect; "" on the defaults."""
    default, found = DDPOptions(), []
    cap = ddp.bucket_bytes_cap / 2 ** 20
    if cap != default.bucket_cap_mb:
        found.append(f"bucket_cap_mb={cap:g}")
    for option in ("gradient_as_bucket_view", "find_unused_parameters"):
        if getattr(ddp, option) != getattr(default, option):
            found.append(f"{option}={getattr(ddp, option)}")
    return f"{name}: DistributedDataParallel built with {', '.join(found)}" if found else ""


def _unverified_group():
    """None (the default group), except under TORCH_DISTRIBUTED_DEBUG=DETAIL: there torch
    2.13 segfaults while constructing DDP on a verifying (wrapped) group, so DDP gets a
    plain group of the same ranks and the verification covers every other collective."""
    if dist.get_debug_level() != dist.DebugLevel.DETAIL:
        return None
    dist.set_debug_level(dist.DebugLevel.OFF)
    try:
        return dist.new_group(backend=dist.get_backend())
    finally:
        dist.set_debug_level(dist.DebugLevel.DETAIL)
