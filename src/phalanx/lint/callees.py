"""What a call's callee is, by the file's imports: torch.distributed.checkpoint's state-dict
helpers and save/load (collectives) — not Accelerate's `accelerator.get_state_dict`, which
gathers only under FSDP / ZeRO-3 — and whether a collective names its own process group."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, dotted, keyword, last, whether_distributed
from phalanx.lint.syntax import walk

DCP = "torch.distributed.checkpoint"
DCP_CALLS = {"get_state_dict", "get_model_state_dict", "get_optimizer_state_dict",
             "set_state_dict", "set_model_state_dict", "set_optimizer_state_dict", "async_save"}
# where each collective takes its `group` positionally (torch.distributed's signatures)
GROUP_POSITION = {"barrier": 0, "monitored_barrier": 0, "all_reduce": 2, "broadcast": 2,
                  "broadcast_object_list": 2, "all_gather": 2, "all_gather_object": 2,
                  "all_gather_into_tensor": 2, "all_to_all": 2, "reduce": 3,
                  "reduce_scatter": 3, "reduce_scatter_tensor": 3, "gather": 3,
                  "gather_object": 3, "scatter": 3, "scatter_object_list": 3,
                  "all_to_all_single": 4}


def origin(ctx: Context, name: str) -> str:
    """`torch.distributed.checkpoint.save` for `dcp.save` after `import
    torch.distributed.checkpoint as dcp`; `name` itself when its root is not imported."""
    root, _, rest = name.partition(".")
    source = ctx.imported.get(root)
    if source is None:
        return name
    if source == root or source.startswith(root + "."):  # `import torch.distributed...`
        return name
    return f"{source}.{rest}" if rest else source


def dcp_call(ctx: Context, call: ast.Call) -> bool:
    """`call` is one of DCP's state-dict helpers, or its save / load: a bare name imported
    from torch.distributed.checkpoint, or a function of a module alias bound to it (in a
    snippet importing neither: of `dcp` or `checkpoint`)."""
    func, method = call.func, last(dotted(call))
    if method not in DCP_CALLS and method not in ("save", "load"):
        return False
    if isinstance(func, ast.Name):
        return func.id in ctx.imported and origin(ctx, func.id).startswith(DCP + ".")
    if not isinstance(func, ast.Attribute):
        return False
    receiver = dotted(func.value)
    if not receiver:
        return False
    if receiver.split(".")[0] not in ctx.imported and receiver.split(".")[0] not in ctx.defined:
        return isinstance(func.value, ast.Name) and receiver in ("dcp", "checkpoint")
    full = origin(ctx, receiver)
    return full == DCP or full.startswith(DCP + ".")


def own_group(call: ast.Call) -> bool:
    """The collective `call` names a process group of its own (`group=replicate`, not None
    nor `dist.group.WORLD`): it involves only that group's members."""
    group = keyword(call, "group")
    if group is None:
        group = keyword(call, "process_group")
    position = GROUP_POSITION.get(last(dotted(call)))
    if group is None and position is not None and len(call.args) > position:
        group = call.args[position]
    if group is None or isinstance(group, ast.Starred):
        return False
    if isinstance(group, ast.Constant):
        return group.value is not None
    return not dotted(group).endswith(("group.WORLD", "GroupMember.WORLD"))


WORLD_WORDS = ("world", "distributed", "ddp", "initialized", "available", "nproc", "gpus")


def opens_for_all(ctx: Context, test: ast.expr, holds: bool) -> bool:
    """The path condition (`test` when `holds`, else its negation) has an `or` with a
    flag or a comparison of something other than a rank or the world's size (`_uniform`),
    and its other `and`
    parts read no rank — `not skip and (ckpt_type != LEGACY or dp_rank == 0)`: when it
    holds, every rank passes; only some ranks is no certainty. (`not
    dist.is_initialized() or rank == 0` still splits the world.)"""
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, holds = test.operand, not holds
    if not isinstance(test, ast.BoolOp):
        return False
    if isinstance(test.op, ast.Or if holds else ast.And):
        return any(_uniform(ctx, d) or opens_for_all(ctx, d, holds) for d in test.values)
    opening = [opens_for_all(ctx, c, holds) for c in test.values]
    return any(opening) and all(o or not ctx.rank_dependent(c)
                                for o, c in zip(opening, test.values))


def _uniform(ctx: Context, part: ast.expr) -> bool:
    """A comparison or a flag (`load_on_all_ranks`) reading no rank nor the world's size."""
    while isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not):
        part = part.operand
    if not isinstance(part, (ast.Compare, ast.Name, ast.Attribute)) or ctx.rank_dependent(part) \
            or whether_distributed(part):
        return False
    words = [getattr(n, "id", getattr(n, "attr", "")).lower() for n in walk(part)]
    return not any(w in word for word in words for w in WORLD_WORDS)
