"""A DataLoader over `ShardedBatchSampler` whose batches arrive on the rank's device."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from phalanx.data.sampler import ShardedBatchSampler
from phalanx.errors import UserError


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

    `position` counts the global samples of the batches handed out (not those a worker
    process fetched ahead): `state_dict()` is what `run.save(..., loader=loader)` commits
    and `run.resume` restores, so a resumed loop gets the next batch the interrupted one
    would have — at any world size, since the cursor is global. A loop that leaves an
    epoch early and then saves resumes in that epoch, where the uninterrupted run's next
    `for` would have begun the next one.
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
        self.position = sampler.position

    def __iter__(self) -> Iterator[Any]:
        s = self.sampler
        start, step = s.position, s.batch_size * s.world_size
        self.position = start
        for batch in self.dataloader:
            self.position += step
            yield to_device(batch, self.device)
        if not s.stream:  # the epoch is done: the cursor is at the next one's start
            self.position = (start // s.num_samples + 1) * s.num_samples

    def state_dict(self) -> dict[str, Any]:
        """The cursor and what it means: JSON-able, world-size free."""
        s = self.sampler
        return {"position": self.position, "num_samples": s.num_samples, "seed": s.seed,
                "shuffle": s.shuffle, "global_batch": s.batch_size * s.world_size}

    def load_state_dict(self, state: dict[str, Any], where: str = "the checkpoint") -> None:
        """Continue from `state`'s cursor; a dataset or order that changed since is refused
        (it would resume at other samples, silently)."""
        s = self.sampler
        for key, now in (("num_samples", s.num_samples), ("seed", s.seed),
                         ("shuffle", s.shuffle)):
            if key in state and state[key] != now:
                what = {"num_samples": "samples in the dataset", "seed": "the loader's seed",
                        "shuffle": "shuffle"}[key]
                raise UserError(
                    f"{where} was saved with {what} = {state[key]}, and this loader has "
                    f"{now}: resuming would read other samples than the interrupted run. "
                    f"Resume with the same dataset and loader settings, or start a new run.")
        s.position = self.position = int(state["position"])

    def __len__(self) -> int:
        """Batches per epoch (epoch mode), whatever the cursor."""
        return len(self.sampler)

    @property
    def remaining(self) -> int:
        """Batches the next `for batch in loader` yields: `len(loader)`, or fewer when the
        cursor is mid-epoch (after `run.resume`)."""
        return self.sampler.batches_left()

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will produce."""
        return self.sampler.epoch
