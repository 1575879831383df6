"""What wrapping does to a model's tensors, modules and names, undone in one place: the
local part of a sharded tensor (FSDP's DTensors), the module inside `torch.compile`'s
wrapper, and a parameter's name without the wrappers' prefixes. Code outside the
strategies asks these instead of probing (`hasattr(t, "to_local")`, `_orig_mod`)."""

from __future__ import annotations

import sys

import torch
import torch.nn as nn


def is_shard(t: torch.Tensor) -> bool:
    """Whether `t` is one rank's shard of a tensor split across ranks (a DTensor). (No
    DTensor exists before torch's module is imported; asking here does not import it, a
    second in every process that never shards.)"""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor (DTensor), or the tensor itself."""
    return t.to_local() if is_shard(t) else t  # type: ignore[attr-defined]


def uncompiled(module: nn.Module) -> nn.Module:
    """The module inside `torch.compile`'s wrapper (OptimizedModule), or the module."""
    return getattr(module, "_orig_mod", module)


def compiled(module: nn.Module) -> bool:
    """Whether `module` is `torch.compile`'s wrapper (its state dict's names would carry
    `_orig_mod.`)."""
    return uncompiled(module) is not module


def user_name(name: str) -> str:
    """A parameter's name as the user's module spells it: without DDP's `module.` and
    torch.compile's `_orig_mod.`."""
    return name.removeprefix("module.").replace("_orig_mod.", "")


def tied_names(model: nn.Module) -> list[list[str]]:
    """The names of each parameter `model` holds under several names (a tied head)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def tie(model: nn.Module, names: list[str]) -> None:
    """Every one of `names` holds the first name's parameter again (what `to_empty` and
    `parallelize_module` untie: they give each module its own copy)."""
    kept = model.get_parameter(names[0])
    for name in names[1:]:
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner), leaf, kept)
