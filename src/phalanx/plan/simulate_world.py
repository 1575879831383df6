"""The fake world `phalanx plan --simulate` runs one rank in: torch's fake process group
(with the launcher variables `phalanx.init` reads), fake tensors that `Module.to` can
move, a dispatch mode that records collectives, and DDP's comm hook for that group."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from phalanx.errors import UserError

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
MEMO_KEPT = 1  # fake tensors the converter's memo keeps (`fake_tensors`)


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0, per_machine: int | None = None
               ) -> Iterator[None]:
    """The fake process group of `world_size` ranks, this process rank `rank`, and the
    launcher variables `phalanx.init` reads (it then reuses the group: it creates one
    only when none is initialised); `per_machine` ranks on each machine (None: one
    machine holds them all — no layout note about groups spanning machines). Afterwards
    the group is destroyed and the variables, torch's thread count and `sys.excepthook`
    (which `phalanx.init` chains) restored."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise UserError("`--simulate` runs rank r of an N-rank job in this process, and a "
                        "process group is already initialised here; run it from a fresh "
                        "process (phalanx plan --simulate), not inside a running job.")
    if not 0 <= rank < world_size:
        raise UserError(f"`--simulate-rank {rank}` is not a rank of {world_size}: give "
                        f"0 … {world_size - 1}.")
    saved = {k: os.environ.get(k) for k in _ENV}
    hook, threads = sys.excepthook, torch.get_num_threads()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE=str(min(per_machine or world_size, world_size)))
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.excepthook = hook
        torch.set_num_threads(threads)


def recorder():
    """A dispatch mode that records every collective (op, bytes of its largest tensor)
    and answers reads of a tensor's value (`.item()`) under fake tensors: 1.0 for a
    floating tensor (an optimizer's step count: bias corrections stay finite), True for a
    boolean (a check that the ranks agree passes: the simulated ranks are this one's
    copies), 0 otherwise. Memory does not depend on these values."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.log: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default and _is_fake(args[0]):
                dtype = args[0].dtype
                return 1.0 if dtype.is_floating_point else True if dtype == torch.bool else 0
            out = func(*args, **(kwargs or {}))
            if func.namespace in ("c10d", "_c10d_functional") and "barrier" not in func.__name__:
                sizes = [t.nbytes for t in tree_leaves((args, kwargs, out))
                         if isinstance(t, torch.Tensor)]
                self.log.append((func.__name__.split(".")[0], max(sizes, default=0)))
            return out

    return Recorder()


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


@contextlib.contextmanager
def fake_tensors() -> Iterator[None]:
    """FakeTensorMode whose converter remembers only the last few fake tensors it made, by
    plain references: its own memo's weak references would stop `Module.to` (which swaps
    a fake parameter's contents and refuses tensors with weak references) in the
    strategy's "move to device" step, and a memo of every one would keep thousands alive
    that the real step frees (the tracker counted them: fsdp's activations 1.5× at 1,024
    ranks). The converter reads back what it has just made (a view's base: tensor
    parallelism's vocabulary masks), so the last one stays. A DeviceMesh
    made inside it (FSDP2 over a tensor-parallel model joins the two meshes into one)
    computes its rank tables with real tensor operations: with the fake mode suspended,
    as before it was entered (torch's class, patched while the mode is on)."""
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    class LastFew(dict):
        def __setitem__(self, key, value) -> None:
            super().__setitem__(key, value)
            while len(self) > MEMO_KEPT:
                del self[next(iter(self))]

    mode = FakeTensorMode()
    mode.fake_tensor_converter.meta_converter.tensor_memo = \
        LastFew()  # type: ignore[assignment]
    init = DeviceMesh.__init__

    def real_mesh(self, *args, **kwargs) -> None:
        with unset_fake_temporarily():
            init(self, *args, **kwargs)

    DeviceMesh.__init__ = real_mesh  # type: ignore[method-assign]
    try:
        with mode:
            yield
    finally:
        DeviceMesh.__init__ = init  # type: ignore[method-assign]


def count_hook(log: list):
    """DDP's comm hook under the fake group: records the bucket's all-reduce and returns
    the bucket as it is (the fake group's all-reduce gives the reducer no tensor back)."""
    import torch

    def hook(state, bucket):
        buf = bucket.buffer()
        log.append(("allreduce_", buf.nbytes))
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(buf)
        return done

    return hook
