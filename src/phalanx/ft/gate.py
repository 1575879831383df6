"""What the trainer's loop runs around each step (`step_gate`): torchft's `ReplicaGroup`
in a replica group of `--fault-tolerance torchft`, else `NoReplicas` (nothing); and the
data a replica group reads when its place in the quorum changes per step
(`QuorumBatches`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.utils.data import default_collate

from phalanx.cluster import protocol
from phalanx.data.loader import to_device
from phalanx.data.sampler import ShardedBatchSampler


class QuorumBatches:
    """The trainer's micro-batches when the data-parallel rank and world change per step:
    `aim(position, rank, world)` before each step, then one `next()` per micro-step —
    the positions ShardedBatchSampler's stream mode gives rank `rank` of `world`.
    `read`: the sample indices read since the last `aim` (this step attempt's)."""

    def __init__(self, dataset, batch_size: int, seed: int, device: torch.device) -> None:
        self.dataset, self.batch_size, self.device = dataset, batch_size, device
        self.sampler = ShardedBatchSampler(len(dataset), batch_size, 0, 1, seed=seed,
                                           stream=True)
        self.cursor, self.stride = 0, batch_size
        self.read: list[int] = []

    def aim(self, position: int, rank: int, world: int) -> None:
        self.cursor, self.stride = position + rank * self.batch_size, world * self.batch_size
        self.read = []

    def __iter__(self) -> QuorumBatches:
        return self

    def __next__(self) -> Any:
        indices = self.sampler.indices(self.cursor, self.batch_size)
        self.read.extend(indices)
        items = [self.dataset[i] for i in indices]
        self.cursor += self.stride
        return to_device(default_collate(items), self.device)  # as DeviceLoader's batches


class NoReplicas:
    """The trainer's loop without torchft: every step commits, with the fixed global
    batch; the data comes from `run.loader`; the stop is agreed by `run.stop_requested`."""

    rank = None
    aims_batches = False
    healed = False
    val_world = None  # each rank evaluates its val share (train.loop.evaluate)

    def __init__(self, global_batch: int) -> None:
        self.global_batch = global_batch

    def attach(self, result: Any) -> None:
        pass

    def begin_step(self, batches: Any) -> None:
        pass

    def average(self, model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def commit(self) -> bool:
        return True

    def stop(self, run) -> int:
        return run.stop_requested()

    def stepped(self, model: nn.Module) -> None:
        pass

    def rolled_back(self, state: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass


def step_gate(run, cfg, out_dir: Path | None):
    """A `ReplicaGroup` in a group started by `phalanx.ft.groups`, else `NoReplicas`."""
    t = cfg.train
    group_batch = t.micro_batch_size * t.grad_accum * run.topology.dp_size
    found = protocol.replica_group() if cfg.dist.fault_tolerance != "none" else None
    if found is None:
        return NoReplicas(group_batch)
    from phalanx.ft.replica import ReplicaGroup

    return ReplicaGroup(run, cfg.dist, found[0], found[1], group_batch, out_dir, t.max_steps)
