"""Runtime guards: are the replicas identical, and is every tensor where it should be?

`fingerprints` reduces each parameter/buffer to two int64 numbers computed from its
bits (a plain sum and a position-weighted sum of the raw words, wrapping on overflow):
equal tensors give equal fingerprints, and one flipped bit changes them. One
all_gather of these numbers compares every tensor on every rank.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from phalanx.errors import DistributedError

_WORD = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def named_state(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    """Two int64s from the tensor's bits (exact: no float rounding involved)."""
    flat = t.detach().contiguous().view(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    words = flat.view(_WORD[flat.element_size()]).to(torch.int64)
    weights = torch.arange(1, words.numel() + 1, device=words.device, dtype=torch.int64) % 65521
    return torch.stack([words.sum(), (words * (weights + 1)).sum()])


def fingerprints(state: list[tuple[str, torch.Tensor]], device: torch.device
                 ) -> tuple[list[str], torch.Tensor]:
    """Names, and a [1 + n, 2] int64 tensor: row 0 stands for the structure (names,
    shapes, dtypes), row 1 + i for tensor i."""
    layout = "|".join(f"{n}:{tuple(t.shape)}:{t.dtype}" for n, t in state).encode()
    digest = int.from_bytes(hashlib.sha256(layout).digest()[:8], "little", signed=True)
    # made by factories, not lifted from a Python list: `plan --simulate` runs this on
    # fake tensors, whose mode converts no real tensor (plan.simulate_world.fake_tensors)
    rows = [torch.stack([torch.full((), v, dtype=torch.int64, device=device)
                         for v in (digest, len(state))])]
    rows += [fingerprint(t).to(device) for _, t in state]
    return [n for n, _ in state], torch.stack(rows)


def _majority(values: list[tuple], ranks: list[int]) -> tuple[list[int], list[int]]:
    """(ranks agreeing with the largest group — rank 0's on a tie, the others)."""
    groups: dict[tuple, list[int]] = {}
    for r, v in zip(ranks, values):
        groups.setdefault(v, []).append(r)
    best = max(groups.values(), key=lambda g: (len(g), 0 in g))
    return best, [r for r in ranks if r not in best]


def check_consistency(model: nn.Module, device: torch.device, world_size: int) -> None:
    """Raise `DistributedError` (on every rank) naming the first parameter or buffer that
    differs between ranks."""
    check_same(named_state(model), device, world_size, "parameters and buffers")


def check_same(state: list[tuple[str, torch.Tensor]], device: torch.device, world_size: int,
               what: str, groups: list[list[int]] | None = None) -> None:
    """Raise `DistributedError` (on every rank) naming the first tensor of `state` that
    differs between ranks, and the ranks that disagree. `groups`: the sets of ranks that
    must agree (default: all of them); every rank takes part in the one all_gather."""
    names, local = fingerprints(state, device)
    gathered = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(gathered, local)
    if not all(g.shape == local.shape for g in gathered):
        raise DistributedError("the models differ in their number of tensors across ranks "
                               "(different architectures?).", [])
    table = torch.stack(gathered).cpu()  # one copy from the device, not one per rank·tensor
    for ranks in groups or [list(range(world_size))]:
        # (rows by int index: `plan --simulate` runs this on fake tensors, and indexing
        # with a Python list would lift the list into a real tensor, which its mode refuses)
        rows = torch.stack([table[r] for r in ranks])
        if not bool((rows == rows[0]).all()):
            _name_difference(rows.tolist(), ranks, names, what)


def _name_difference(rows: list, ranks: list[int], names: list[str], what: str) -> None:
    agree, disagree = _majority([tuple(r[0]) for r in rows], ranks)
    if disagree:
        raise DistributedError(
            f"the models differ in structure (parameter names, shapes or dtypes): ranks "
            f"{disagree} disagree with ranks {agree}. Build the same model on every rank.",
            disagree)
    for i, name in enumerate(names, start=1):
        agree, disagree = _majority([tuple(r[i]) for r in rows], ranks)
        if disagree:
            raise DistributedError(
                f"the replicas' {what} have diverged: `{name}` differs on rank(s) "
                f"{', '.join(map(str, disagree))} from rank(s) {', '.join(map(str, agree))} "
                f"(the first that differs). Something changed one replica "
                f"outside the synchronised step: a rank-dependent update, an in-place edit "
                f"on one rank, or a non-deterministic kernel.", disagree)


def replica_sets(mesh: Any, dims: tuple[str, ...] = ("dp_replicate",)) -> list[list[int]]:
    """The sets of ranks that hold the same shards: those whose mesh coordinates differ
    only in `dims` (dp_replicate: HSDP's columns, per tp coordinate with tp; with "tp"
    too: the tensors tensor parallelism leaves whole); [] when those dimensions are all
    of size 1 or absent (each rank's shard is its own)."""
    names = list(getattr(mesh, "mesh_dim_names", None) or ())
    at = [names.index(d) for d in dims if d in names and mesh.mesh.shape[names.index(d)] > 1]
    if not at:
        return []
    ranks = mesh.mesh.movedim(at, list(range(-len(at), 0)))
    return ranks.reshape(-1, math.prod(mesh.mesh.shape[i] for i in at)).tolist()


def check_sharded(model: nn.Module, device: torch.device, world_size: int, rank: int,
                  mesh: Any = None) -> None:
    """For sharded models: this rank's shard of every DTensor has the shape its placement
    gives this rank, every rank has the same layout (names, global shapes, placements),
    every unsharded tensor (buffers, plain parameters) is identical on all ranks, and
    (HSDP, `mesh` 2-D) the ranks of one replica set hold bit-identical shards."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    state, wrong = [], None
    for name, t in named_state(model):
        if not isinstance(t, DTensor):
            state.append((name, t))
            continue
        expected, _ = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        if tuple(t.to_local().shape) != tuple(expected) and wrong is None:
            wrong = (f"`{name}`'s shard is {tuple(t.to_local().shape)}, its placement "
                     f"{t.placements} says {tuple(expected)}")
        layout = f"{tuple(t.shape)}|{t.placements}|{t.dtype}".encode()
        code = int.from_bytes(hashlib.sha256(layout).digest()[:8], "little", signed=True)
        state.append((f"{name} (layout)", torch.tensor([code], dtype=torch.int64)))
    problems = [None] * world_size
    dist.all_gather_object(problems, wrong)
    bad = [r for r, p in enumerate(problems) if p]
    if bad:
        raise DistributedError(f"rank {bad[0]} does not hold the shard it should: "
                               f"{problems[bad[0]]}. Something replaced the sharded "
                               f"parameters after run.setup().", bad)
    check_same(state, device, world_size, "unsharded tensors and shard layouts")
    sets = replica_sets(mesh)
    if sets:
        shards = [(f"{name} (shard)", t.to_local()) for name, t in named_state(model)
                  if isinstance(t, DTensor)]
        check_same(shards, device, world_size, "parameter shards (HSDP replicas)", sets)
    whole = replica_sets(mesh, ("dp_replicate", "tp"))
    if whole and whole != sets:  # what tensor parallelism leaves whole: the same on a tp group
        shards = [(f"{name} (shard)", t.to_local()) for name, t in named_state(model)
                  if isinstance(t, DTensor) and "tp" not in (t.device_mesh.mesh_dim_names or ())]
        check_same(shards, device, world_size,
                   "parameter shards (replicas across the tensor-parallel group)", whole)


def diagnose_devices(model: nn.Module, expected: torch.device, batch: Any = None) -> list[str]:
    """One line per tensor not on `expected`: parameters, buffers, and the batch's tensors
    (nested lists/tuples/dicts). Empty when everything is in place."""
    found = []
    for kind, items in (("parameter", model.named_parameters()),
                        ("buffer", model.named_buffers())):
        for name, t in items:
            if not _same(t.device, expected):
                found.append(f"{kind} `{name}` is on {t.device}, expected {expected}")
    for path, t in _tensors(batch, "batch"):
        if not _same(t.device, expected):
            found.append(f"input `{path}` is on {t.device}, expected {expected}")
    return found


def _same(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _tensors(obj: Any, path: str):
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{path}[{k!r}]")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{path}[{i}]")
