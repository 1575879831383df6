"""A replicated strategy's state dict, read for a checkpoint: straight from the module
(`direct_state`, when it is `plain`), and dealt out so that each tensor every rank holds
is written by one rank (`share_of_replicated`). `checkpoint.store`, a layer below,
knows nothing of strategies; DCP's template/apply, which it uses for any model, stay
there (`dcp_template`, `dcp_apply`).
"""

from __future__ import annotations

from typing import Any

import torch

from phalanx.strategies.tensors import compiled


def direct_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """{"model": ..., "optim": ...} read straight from a module whose parameters are plain,
    whole tensors (single, DDP, ZeRO's replicated model): the same keys and tensors
    `get_state_dict` gives (tested), in a tenth of the time — most of an async save's
    stall. The optimizer part covers the parameters `optimizer` holds state for."""
    msd = module.state_dict()
    if optimizer is None:
        return {"model": msd}
    names = {id(p): n for n, p in module.named_parameters()}
    return {"model": msd, "optim": {names[id(p)]: dict(s) for p, s in optimizer.state.items()}}


def _leaves(tree: Any, path: tuple = ()):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from _leaves(value, path + (key,))
    else:
        yield path, tree


def share_of_replicated(state: dict, rank: int, world: int, plans: dict | None = None) -> dict:
    """This rank's part of a state every rank holds in full: tensors dealt out largest
    first to the least-loaded rank (the same answer on every rank), non-tensors to rank
    0. DCP then writes and stages each tensor once, and loads at any world size.
    `plans`: a dict kept by the caller between saves, where the dealing of a state with
    the same names, shapes and dtypes is remembered (it was most of the call's time)."""
    leaves = list(_leaves(state))
    key = (world, *((p, tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (p,)
                    for p, v in leaves))
    owner = None if plans is None else plans.get(key)
    if owner is None:
        owner = _deal(leaves, world)
        if plans is not None:
            plans.clear()  # one state shape at a time: the newest
            plans[key] = owner
    mine: dict = {}
    for path, value in leaves:
        if owner.get(path, 0) == rank:
            node = mine
            for key_part in path[:-1]:
                node = node.setdefault(key_part, {})
            node[path[-1]] = value
    return mine


def _deal(leaves: list, world: int) -> dict[tuple, int]:
    """{path: rank} for every tensor leaf: largest first, to the least-loaded rank."""
    size = {p: v.numel() * v.element_size() for p, v in leaves if isinstance(v, torch.Tensor)}
    load, owner = [0] * world, {}
    for path in sorted(size, key=lambda p: (-size[p], p)):
        r = min(range(world), key=lambda i: (load[i], i))
        owner[path], load[r] = r, load[r] + size[path]
    return owner


def plain(module: torch.nn.Module) -> bool:
    """Whether `direct_state` reads `module` as `get_state_dict` would: not compiled (its
    names would carry `_orig_mod.`), every parameter a plain, whole tensor."""
    return not compiled(module) and all(
        type(p) is torch.nn.Parameter or type(p) is torch.Tensor for p in module.parameters())
