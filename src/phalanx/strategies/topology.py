"""The job's shape as one value, built before any strategy: who this process is, where
its tensors live, and how data is split (the data-parallel rank and size).

Every layout Phalanx builds today is data parallel (replicated, sharded, or both: HSDP),
so the data-parallel group is the whole world; the fields are separate so that data
loading never asks the global rank by accident (a tensor-parallel group would share one
data shard).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from phalanx.config.layout import Layout
from phalanx.errors import UserError


@dataclass(frozen=True)
class Topology:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str
    launcher: str
    dp_rank: int
    dp_size: int
    # the sharded strategy's DeviceMesh: 1-D "dp" over the world, or 2-D (dp_replicate,
    # dp_shard) for HSDP (config.layout.Layout.mesh_dims); None for the others
    mesh: Any = None
    peers: Any = None  # a phalanx.cluster.peers.Peers: each rank's host, for errors that name it

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world_size and 0 <= self.dp_rank < self.dp_size
                and self.world_size % self.dp_size == 0):
            raise UserError(
                f"inconsistent job shape: rank {self.rank} of world {self.world_size}, "
                f"data-parallel rank {self.dp_rank} of {self.dp_size}; the data-parallel "
                f"size must divide the world size and each rank lie within its range.")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def data_parallel(rank: int, local_rank: int, world_size: int, local_world_size: int,
                  device: torch.device, backend: str, launcher: str,
                  layout: Layout | None = None, peers: Any = None) -> Topology:
    """Data parallelism over the whole world; `layout` (a sharded strategy's) builds its
    DeviceMesh (`layout.mesh_dims()`; HSDP's dimensions make subgroups: every rank joins
    each one's creation)."""
    mesh = None
    if layout is not None:
        from torch.distributed.device_mesh import init_device_mesh

        if layout.world != world_size:
            raise UserError(f"the layout {layout.describe()} spans {layout.world} ranks, and "
                            f"this job has {world_size}.")
        names, sizes = layout.mesh_dims()
        mesh = init_device_mesh(device.type, sizes, mesh_dim_names=names)
    return Topology(rank=rank, local_rank=local_rank, world_size=world_size,
                    local_world_size=local_world_size, device=device, backend=backend,
                    launcher=launcher, dp_rank=rank, dp_size=world_size, mesh=mesh,
                    peers=peers)
