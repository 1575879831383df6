"""Sharded, resumable batch sampling whose global batches do not depend on world size.

The sampler sees the data as one stream of positions: position p belongs to epoch
p // n and names sample perm(seed, epoch)[p % n]. A *global* batch is a run of
consecutive positions; rank r takes its slice of it:

    global batch m  = positions [m·W·B, (m+1)·W·B)
    rank r's batch  = positions [m·W·B + r·B, m·W·B + (r+1)·B)

So the samples an optimizer step sees (its K micro-batches on all W ranks) are positions
[t·K·W·B, (t+1)·K·W·B) whatever K, W and B are, as long as K·W·B is the same. That is
what lets 2 ranks × B equal 1 rank × 2B, and lets a run resume at another world size
from a global cursor without skipping or repeating a sample.

Both modes keep one cursor, `position`: the global samples consumed since the start
(epoch = position // n). Epoch mode (the default for `run.loader`) yields the whole
global batches left in the position's epoch and moves to the next epoch on every new
iteration: reshuffled without `set_epoch`; started (or resumed) mid-epoch at position p,
it yields that epoch's batches from offset p % n on. Stream mode (the trainer) yields
forever from `position` onward, across epochs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset

from phalanx.errors import UserError


class ShardedBatchSampler:
    """Yields this rank's lists of sample indices. See the module docstring."""

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int, *,
                 seed: int = 0, shuffle: bool = True, stream: bool = False,
                 position: int = 0) -> None:
        if batch_size <= 0:
            raise UserError(f"batch_size must be positive, got {batch_size}.")
        global_batch = batch_size * world_size
        if num_samples < (1 if stream else global_batch):
            raise UserError(
                f"the dataset has {num_samples} samples, fewer than one global batch "
                f"(batch_size {batch_size} × {world_size} ranks = {global_batch}). "
                f"Use a smaller batch size or more data.")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle, self.stream = seed, shuffle, stream
        if position < 0:
            raise UserError(f"position must be >= 0 (global samples consumed), got {position}.")
        self.position = position  # global samples consumed: where the next iteration starts
        self._perm_epoch, self._perm = -1, torch.arange(0)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if epoch != self._perm_epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._perm = torch.randperm(self.num_samples, generator=g)
            else:
                self._perm = torch.arange(self.num_samples)
            self._perm_epoch = epoch
        return self._perm

    def indices(self, start: int, count: int) -> list[int]:
        """Sample indices at global stream positions [start, start + count)."""
        out = []
        for p in range(start, start + count):
            epoch, k = divmod(p, self.num_samples)
            out.append(int(self._permutation(epoch)[k]))
        return out

    def _mine(self, batch_start: int) -> list[int]:
        return self.indices(batch_start + self.rank * self.batch_size, self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        step = self.batch_size * self.world_size
        if self.stream:
            while True:
                start = self.position
                self.position += step
                yield self._mine(start)
        batches = self.batches_left()
        epoch, offset = divmod(self.position, self.num_samples)
        self.position = (epoch + 1) * self.num_samples  # the next iteration: the next epoch
        for m in range(batches):
            yield self._mine(epoch * self.num_samples + offset + m * step)

    def __len__(self) -> int:
        """Batches in an epoch (epoch mode; incomplete global batches are dropped): the
        same before and after a resume, so a schedule sized by it does not change."""
        if self.stream:
            raise TypeError("a stream-mode sampler is endless and has no length")
        return self.num_samples // (self.batch_size * self.world_size)

    def batches_left(self) -> int:
        """Batches the next iteration yields (epoch mode): those left in the position's
        epoch — fewer than `len` when it starts mid-epoch (a resumed run)."""
        left = self.num_samples - self.position % self.num_samples
        return left // (self.batch_size * self.world_size)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self.position // self.num_samples


def map_style_length(dataset: Any) -> int:
    """`len(dataset)` of a map-style dataset; a UserError for one without a length that is
    no IterableDataset either (a sampler shards by index and resumes at a position)."""
    name = type(dataset).__name__
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise UserError(
            f"run.loader needs a map-style dataset (with __len__ and __getitem__), so that "
            f"it can shard by index and resume at a sample position, or a torch "
            f"IterableDataset that shards itself by rank; `{name}` has no __len__ and is "
            f"no IterableDataset. Give it a __len__, or make it an IterableDataset that "
            f"yields run.rank's share.")
    return len(dataset)
