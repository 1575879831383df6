"""Every rank starts from rank 0's weights, whatever each rank's generator drew.

`phalanx.init` seeds each rank from (seed, rank), so a model built after it is initialised
differently on every rank. DDP hides that by broadcasting rank 0's parameters and buffers
when it is constructed; FSDP2's `fully_shard` has no such step (FSDP1's
`sync_module_states` is gone), so without this module each rank's shard would come from
its own initialisation: a splice that changes with the world size. Here, before any
wrapping or sharding:

- a model on real devices gets rank 0's parameters and buffers by broadcast (torch's
  own `_sync_module_states`, the function DDP's constructor calls), then a guard: one
  all-gather of every tensor's bit fingerprint (`guards.check_same`) — a rank that still
  differs fails setup in one line naming the tensor and the ranks;
- a model on the meta device is initialised once, on rank 0, on the CPU (its own
  `init_weights()`, else every submodule's `reset_parameters()`), so that it equals the
  one-rank run's bit for bit. Replicated strategies then broadcast it; FSDP loads it into
  the shards with `set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`
  (`full_weights_on_rank0`). The cost: one full copy of the model in rank 0's CPU memory
  while setup runs.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from phalanx.strategies.guards import check_same, named_state
from phalanx.strategies.tensors import tie, tied_names
from phalanx.strategies.topology import Topology

_BUCKET = 250 * 2 ** 20  # bytes per coalesced broadcast (DDP's default broadcast bucket)


def on_meta(model: nn.Module) -> bool:
    return any(t.is_meta for _, t in named_state(model))


def initialise(model: nn.Module) -> nn.Module:
    """Give a meta-device model storage on the CPU and its own initialisation:
    `init_weights()` if it has one, else every submodule's `reset_parameters()`. Tied
    weights stay tied (`empty`)."""
    empty(model, "cpu")
    with torch.no_grad():
        if hasattr(model, "init_weights"):  # (torch types a Module's attributes Tensor | Module)
            model.init_weights()  # type: ignore[operator]
        else:
            for module in model.modules():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()  # type: ignore[operator]  # (as above)
    return model


def place(model: nn.Module, topology: Topology) -> nn.Module:
    """The model on this rank's device. A meta-device model: rank 0 initialises it (on the
    CPU, then moved); the other ranks get uninitialised storage for `from_rank0` to fill."""
    if not on_meta(model):
        return model.to(topology.device)
    if topology.is_main:
        return initialise(model).to(topology.device)
    return empty(model, topology.device)


def empty(model: nn.Module, device: Any) -> nn.Module:
    """`model.to_empty(device)`, its tied weights tied again (to_empty gives each module
    its own copy: a tied head would train apart from its embedding)."""
    tied = tied_names(model)
    model.to_empty(device=device)
    for names in tied:
        tie(model, names)
    return model


def broadcast_from_rank0(model: nn.Module) -> None:
    """Overwrite every rank's parameters and buffers with rank 0's (in place: an
    optimizer already built on them keeps its references)."""
    from torch.distributed.utils import _sync_module_states

    world = dist.group.WORLD
    assert world is not None  # (initialised: from_rank0 runs inside a process group)
    _sync_module_states(model, world, _BUCKET, src=0,
                        params_and_buffers_to_ignore=set(), broadcast_buffers=True)


def from_rank0(model: nn.Module, topology: Topology) -> None:
    """Make every rank hold rank 0's parameters and buffers, and check that they do."""
    if topology.world_size == 1:
        return
    broadcast_from_rank0(model)
    check_same(named_state(model), topology.device, topology.world_size,
               "parameters and buffers at setup (before wrapping)")


def full_weights_on_rank0(model: nn.Module, topology: Topology) -> dict[str, torch.Tensor]:
    """For a meta-device model that is about to be sharded: rank 0's initialisation of the
    whole model, on the CPU, as a state dict with its non-persistent buffers too ({} on
    the other ranks). Built from a copy, so `model` stays on the meta device."""
    if not topology.is_main:
        return {}
    full = initialise(copy.deepcopy(model))
    return {name: t.detach() for name, t in named_state(full)}


def load_full_weights(model: nn.Module, full: dict[str, torch.Tensor],
                      topology: Topology) -> None:
    """Fill a sharded model (storage already allocated) from rank 0's `full` weights:
    parameters and persistent buffers through DCP's broadcast-and-shard, then every
    buffer (FSDP leaves buffers whole) by broadcast."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    keys = set(model.state_dict())
    state: dict[str, Any] = {k: v for k, v in full.items() if k in keys}
    for first, *others in tied_names(model):  # (`full` names a tied weight once)
        state.update({name: state[first] for name in others if first in state})
    set_model_state_dict(model, state, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=topology.world_size > 1))
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, t in full.items():
            if name in buffers:
                buffers[name].copy_(t)
        for t in buffers.values():
            if topology.world_size > 1:
                dist.broadcast(t, src=0)
