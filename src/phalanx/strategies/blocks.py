"""Which submodules are a model's repeated blocks (the units FSDP shards and gathers)."""

from __future__ import annotations

import torch.nn as nn


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The children of the `nn.ModuleList`/`nn.Sequential`/`nn.ModuleDict` whose children
    are all of one class (at least two of them) and that hold the most parameters: a
    transformer's layers (a ModuleDict: torchtitan's, and a pipeline stage's, which keeps
    its blocks' whole-model indices). Empty when the model has no such list (then only the
    root is sharded)."""
    best: list[nn.Module] = []
    best_size = 0
    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) \
                or module is model:
            continue
        children = list(module.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size > best_size:
            best, best_size = children, size
    return best


def describe(model: nn.Module, blocks: list[nn.Module]) -> str:
    """`4 blocks `blocks.0`…`blocks.3` (Block)`, or that there are none."""
    if not blocks:
        return "no repeated blocks found (pass run.setup(..., blocks=[...]) to choose them)"
    names = {id(m): n for n, m in model.named_modules()}
    first, last = names.get(id(blocks[0]), "?"), names.get(id(blocks[-1]), "?")
    kinds = sorted({type(b).__name__ for b in blocks})
    return f"{len(blocks)} blocks `{first}`…`{last}` ({', '.join(kinds)})"


def sharding_note(model: nn.Module, blocks: list[nn.Module]) -> str:
    """What FSDP shards, in the one line `run.setup` says on rank 0."""
    if not blocks:
        return (f"no repeated blocks found in {type(model).__name__}: sharding it as one "
                f"unit (all its parameters gathered at once); to shard per block, pass "
                f"run.setup(..., blocks=[...])")
    return f"sharding {describe(model, blocks)}, then the root"
