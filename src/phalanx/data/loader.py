"""A DataLoader over `ShardedBatchSampler` whose batches arrive on the rank's device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from phalanx.data.sampler import ShardedBatchSampler


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


class DeviceLoader:
    """Iterates this rank's batches, already on `device`.

    Epoch mode: every `for batch in loader` is a new, differently shuffled epoch —
    there is no `set_epoch` to forget. `len(loader)` is the batches per epoch, the same
    on every rank (incomplete global batches are dropped, so no rank waits for another).
    """

    def __init__(self, dataset: Dataset, sampler: ShardedBatchSampler, device: torch.device,
                 **dataloader_kwargs: Any) -> None:
        self.sampler, self.device = sampler, device
        dataloader_kwargs.setdefault("pin_memory", device.type == "cuda")
        # DataLoader draws a base seed when an iteration starts: from the global RNG
        # unless it has a generator of its own, which would shift the dropout masks of
        # a resumed run (its iteration starts at another step than the original's).
        dataloader_kwargs.setdefault("generator", torch.Generator().manual_seed(sampler.seed))
        self.dataloader = DataLoader(dataset, batch_sampler=sampler, **dataloader_kwargs)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.dataloader:
            yield to_device(batch, self.device)

    def __len__(self) -> int:
        return len(self.sampler)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will produce."""
        return self.sampler.epoch
