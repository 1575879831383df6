"""`plan --simulate`'s uneven-shard check reads the dim 0 FSDP splits: under tensor
parallelism a column-wise weight's TP rank holds ⌈d0/T⌉ rows, and FSDP splits those."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard

from phalanx.plan.simulate import _shard_layout


class _Mesh:
    def __init__(self, names: tuple[str, ...], sizes: tuple[int, ...]) -> None:
        self.mesh_dim_names, self._sizes = names, sizes

    def size(self, i: int) -> int:
        return self._sizes[i]


class _Param:
    """What _shard_layout reads of a DTensor parameter."""

    def __init__(self, shape, local_rows: int, mesh: _Mesh, placements) -> None:
        self.shape, self.device_mesh, self.placements = shape, mesh, placements
        self._local_tensor = torch.empty(local_rows, *shape[1:])

    def dim(self) -> int:
        return len(self.shape)


class _Model:
    def __init__(self, **params: _Param) -> None:
        self.params = params

    def named_parameters(self):
        return iter(self.params.items())


TP = _Mesh(("dp_shard", "tp"), (4, 2))


def test_a_column_wise_split_is_judged_on_its_tp_rows() -> None:
    # 12 rows: 6 per TP rank, which 4 FSDP ranks do not split evenly (12 % 4 == 0 does)
    found = _shard_layout(_Model(w=_Param((12, 8), 2, TP, (Shard(0), Shard(0)))), 4)
    assert found == {"w": (6, 2, 1.5)}


def test_a_row_wise_split_leaves_dim_0_whole() -> None:
    model = _Model(w=_Param((12, 8), 3, TP, (Shard(0), Shard(1))),
                   b=_Param((12,), 3, TP, (Shard(0), Replicate())))
    assert _shard_layout(model, 4) == {}


def test_without_tp_the_whole_dim_0_is_split() -> None:
    mesh = _Mesh(("dp_shard",), (4,))
    found = _shard_layout(_Model(w=_Param((10, 8), 3, mesh, (Shard(0),)),
                                 v=_Param((8, 8), 2, mesh, (Shard(0),))), 4)
    assert found == {"w": (10, 3, 2.5)}
