"""The job's shape as one value, built before any strategy: who this process is, where
its tensors live, and how data is split (the data-parallel rank and size).

Data loading reads the data-parallel rank and size, never the global rank: the ranks of
one tensor-parallel group share their replica's batch, and so do a pipeline's stages (the
first reads the ids, the last the targets), so with `--tp T` and `--pp P` the
data-parallel rank is `(rank // T) mod (world / (T·P))` (the mesh puts a tp group on T
consecutive ranks, a stage on world / P) and the size world / (T·P). Without either every
rank is its own data-parallel rank.
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
    # the sharded strategy's DeviceMesh: 1-D "dp" over the world, 2-D (dp_replicate,
    # dp_shard) for HSDP, 3-D (dp_replicate, dp_shard, tp) with tensor parallelism
    # (config.layout.Layout.mesh_dims); None for the others
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
    def dp_mesh(self) -> Any:
        """The mesh FSDP2 shards (and replicates) over: the whole mesh, or without tensor
        parallelism's and the pipeline's dimensions (dp_shard alone when nothing is
        replicated)."""
        if "tp" not in self._names and "pp" not in self._names:
            return self.mesh
        replicated = self.mesh["dp_replicate"].size() > 1
        return self.mesh["dp_replicate", "dp_shard"] if replicated else self.mesh["dp_shard"]

    @property
    def tp_mesh(self) -> Any:
        """This rank's tensor-parallel group as a 1-D mesh; None without one."""
        return self._dimension("tp")

    @property
    def pp_mesh(self) -> Any:
        """This rank's pipeline (one rank per stage) as a 1-D mesh; None without one."""
        return self._dimension("pp")

    @property
    def _names(self) -> tuple[str, ...]:
        return getattr(self.mesh, "mesh_dim_names", None) or ()

    def _dimension(self, name: str) -> Any:
        return self.mesh[name] if name in self._names and self.mesh[name].size() > 1 else None

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def data_parallel(rank: int, local_rank: int, world_size: int, local_world_size: int,
                  device: torch.device, backend: str, launcher: str,
                  layout: Layout | None = None, peers: Any = None) -> Topology:
    """The job's shape; `layout` (a sharded strategy's) builds its DeviceMesh
    (`layout.mesh_dims()`; each dimension makes subgroups: every rank joins each one's
    creation) and, with tensor parallelism or pipeline stages, sets the data-parallel rank
    and size."""
    mesh, tp, pp = None, 1, 1
    if layout is not None:
        from torch.distributed.device_mesh import init_device_mesh

        if layout.world != world_size:
            raise UserError(f"the layout {layout.describe()} spans {layout.world} ranks, and "
                            f"this job has {world_size}.")
        names, sizes = layout.mesh_dims()
        mesh = init_device_mesh(device.type, sizes, mesh_dim_names=names)
        tp, pp = layout.tp, layout.pp
    dp_size = world_size // (tp * pp)  # (a stage's ranks consecutive: see the module doc)
    return Topology(rank=rank, local_rank=local_rank, world_size=world_size,
                    local_world_size=local_world_size, device=device, backend=backend,
                    launcher=launcher, dp_rank=(rank // tp) % dp_size, dp_size=dp_size,
                    mesh=mesh, peers=peers)
