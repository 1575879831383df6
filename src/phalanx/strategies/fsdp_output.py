"""FSDP2 hooks each sharded module's backward on the tensors its forward returns, as torch's
pytree finds them (tensors, tuples, lists, dicts, and the classes registered with it, such
as transformers' outputs). An output pytree cannot open — a `SimpleNamespace`, a plain
class or dataclass — hides them: FSDP2 never gathers that module's parameters again for
the backward, which then fails far from the cause ("setStorage: ... out of bounds for
storage of size 0"). `check_outputs` makes the first forward that does this say so in one
line; after the first forward that needs gradients, the check is gone."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.utils._pytree import tree_leaves

from phalanx.errors import UserError


def check_outputs(model: nn.Module) -> None:
    """Watch the first gradient-enabled forward of every sharded module of `model`."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            _watch(module)


def _watch(module: nn.Module) -> None:
    handle: Any = None

    @torch.compiler.disable  # (host-side, once: not traced under --compile)
    def after(_module, _args, output) -> None:
        if not torch.is_grad_enabled():
            return
        hidden = hidden_tensor(output)
        if hidden is None:
            handle.remove()
            return
        holder, name = hidden
        own = next(c for c in type(_module).__mro__ if not issubclass(c, FSDPModule))
        raise UserError(  # (`own`: the user's class, not the FSDP<class> fully_shard made)
            f"{own.__name__}'s forward returned a {holder} holding `{name}`, a "
            f"tensor that needs gradients, inside an object torch's pytree cannot open: "
            f"FSDP2 hooks the backward on the tensors it finds there and found none, so the "
            f"backward would fail (\"setStorage: ... storage of size 0\"). Return a tensor, "
            f"tuple, list or dict (transformers' outputs are fine), or register {holder} "
            f"with torch.utils._pytree.")

    handle = module.register_forward_hook(after)


def hidden_tensor(output: Any) -> tuple[str, str] | None:
    """(class, attribute) of a tensor needing gradients that `output` holds where torch's
    pytree does not look; None when pytree finds one, or none is hidden."""
    leaves = tree_leaves(output)
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
        return None
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            continue
        for name, value in (getattr(leaf, "__dict__", None) or {}).items():
            if isinstance(value, torch.Tensor) and value.requires_grad:
                return type(leaf).__name__, name
    return None
