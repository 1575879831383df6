"""`run.loader` over an `IterableDataset` (the streaming pattern): the dataset shards
itself, and Phalanx batches it, moves the batches to the device and ends every rank's
epoch together.

The contract, said in docs/own-script.md:
- **The dataset shards itself**: each rank's copy yields only that rank's share (by
  `run.rank` / `run.world_size`, or `torch.distributed.get_rank()`), and with
  `num_workers > 0` each worker only its share of that (`torch.utils.data.get_worker_info`).
  Phalanx cannot see the split, so a dataset that yields the same items on every rank
  trains on them W times.
- **Every rank's epoch ends together**: before each batch the ranks agree (one all-reduce
  of one number) that every rank has one; when one rank's share runs out, every rank stops
  there. Without it the rank with a longer share waits in the next gradient all-reduce for
  ranks that left the loop (DDP's "uneven inputs" hang). So iterating it is a collective:
  every rank iterates it (a loop on rank 0 alone waits for the others), and on CUDA the
  agreement is a small device sync per batch. `even=False` skips the agreement (shares
  known to be equal; a loop that handles the end itself; a rank-0-only loop).
- **No sampler**: `shuffle`, `seed` and `position` belong to the map-style loader and are
  refused here; the global batch is whatever the ranks' shares yield, so the same global
  batch at another world size — Phalanx's guarantee for map-style data — is the dataset's
  business.
- **Resume**: `run.save(loader=...)` keeps each rank's `dataset.state_dict()` when the
  dataset has `state_dict()` / `load_state_dict()` (the items it handed out; its next
  `__iter__` continuing from a loaded state), exact at the same world size and refused at
  another (runtime/user_loader.py). A dataset without them, or with `num_workers > 0`
  (the workers' copies move, this process's does not), is refused at `run.save` in one
  line: torchdata's `StatefulDataLoader` collects its workers' states.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from phalanx.data.loader import DeviceLoader, to_device
from phalanx.data.sampler import ShardedBatchSampler, map_style_length
from phalanx.errors import UserError

SAMPLER_ONLY = ("shuffle", "seed", "position", "stream")
_END = object()  # no batch left (a collate_fn may return None)


class StreamLoader:
    """This rank's batches of a self-sharding IterableDataset, on `device`."""

    def __init__(self, dataset: IterableDataset, batch_size: int, device: torch.device,
                 all_have: Callable[[bool], bool] | None, seed: int,
                 **dataloader_kwargs: Any) -> None:
        if batch_size <= 0:
            raise UserError(f"batch_size must be positive, got {batch_size}.")
        self.dataset, self.device, self.all_have = dataset, device, all_have
        self.workers = int(dataloader_kwargs.get("num_workers", 0))
        dataloader_kwargs.setdefault("pin_memory", device.type == "cuda")
        # its own generator: DataLoader's base seed drawn from the global RNG would shift
        # a resumed run's dropout masks (data/loader.py says how)
        dataloader_kwargs.setdefault("generator", torch.Generator().manual_seed(seed))
        self.dataloader = DataLoader(dataset, batch_size=batch_size, **dataloader_kwargs)

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.dataloader)
        while True:
            batch = next(batches, _END)
            if self.all_have is not None and not self.all_have(batch is not _END):
                return  # some rank's share ran out: every rank ends the epoch here
            if batch is _END:
                return
            yield to_device(batch, self.device)

    def state_dict(self) -> dict[str, Any]:
        """The dataset's own state (run.save(loader=...) gathers every rank's)."""
        name = type(self.dataset).__name__
        if not callable(getattr(self.dataset, "state_dict", None)) or \
                not callable(getattr(self.dataset, "load_state_dict", None)):
            raise UserError(
                f"run.save(loader=...): `{name}` (an IterableDataset) has no state_dict() / "
                f"load_state_dict(), so where its stream stands cannot be saved and a resume "
                f"would start it over. Give it both (the items it handed out; its next "
                f"__iter__ continuing from a loaded state), or save without `loader=` to "
                f"start the data over knowingly.")
        if self.workers:
            raise UserError(
                f"run.save(loader=...): the loader over `{name}` has num_workers="
                f"{self.workers}: the dataset's copies in the worker processes move through "
                f"the stream, this process's does not, so its state_dict() is not where the "
                f"loop stands. Use num_workers=0, or torchdata's StatefulDataLoader(dataset, "
                f"...) (it collects its workers' states) and pass that to run.save.")
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state_dict()  # the same refusals on resume
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]


def loader_for(dataset: Any, batch_size: int, *, device: torch.device, dp_rank: int,
               dp_size: int, seed: int, all_have: Callable[[bool], bool] | None,
               sampler_options: dict[str, Any],
               **dataloader_kwargs: Any) -> DeviceLoader | StreamLoader:
    """`run.loader`'s loader: a sharded, resumable DeviceLoader over a map-style dataset,
    or a StreamLoader over an IterableDataset (`all_have`: None skips the agreement)."""
    if isinstance(dataset, IterableDataset):
        refuse_sampler_options(dataset, sampler_options)
        return StreamLoader(dataset, batch_size, device, all_have, seed,
                            **dataloader_kwargs)
    o = sampler_options
    sampler = ShardedBatchSampler(
        map_style_length(dataset), batch_size, dp_rank, dp_size,
        seed=seed if o["seed"] is None else o["seed"],
        shuffle=True if o["shuffle"] is None else o["shuffle"], stream=o["stream"],
        position=o["position"])
    return DeviceLoader(dataset, sampler, device, **dataloader_kwargs)


def refuse_sampler_options(dataset: Any, given: dict[str, Any]) -> None:
    """`shuffle`, `seed`, `position`, `stream` given for an iterable dataset: one line."""
    named = [k for k in SAMPLER_ONLY if not (  # (the defaults, and shuffle=False, are fine)
        given.get(k) is None or (k in ("stream", "position", "shuffle") and not given[k]))]
    if named:
        raise UserError(
            f"run.loader: {', '.join(f'`{k}`' for k in named)} order or place a map-style "
            f"dataset's samples; `{type(dataset).__name__}` is an IterableDataset, which "
            f"orders and shards its own stream. Drop {'it' if len(named) == 1 else 'them'}, "
            f"or give a map-style dataset (__len__ and __getitem__).")
