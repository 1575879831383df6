"""When an FSDP model's forward or `state_dict()` is proven to be a collective over every
rank (lint.proof, term 2): every wrap of that name in the file shards over the default
group — no `process_group` (FSDP1's second positional argument), `device_mesh` or `mesh`
other than None, and no hybrid `sharding_strategy` (HSDP's groups are each machine's ranks).
Its forward all-gathers the parameters (FSDP1 and FSDP2); an FSDP1 model's `state_dict()`
and `clip_grad_norm_()` run collectives too, unless a file that names `LOCAL_STATE_DICT`
may have made the state dict local (FSDP2's `state_dict()` returns its shards: local)."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, dotted, keyword, last, subtree
from phalanx.lint.wrapping import bound_by

FSDP1 = ("FullyShardedDataParallel", "FSDP")
GROUPS = ("process_group", "device_mesh", "mesh")
ONE_GROUP = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")


def fsdp_collective(ctx: Context, call: ast.Call, models: dict[str, str]) -> bool:
    """`call` is the forward, `state_dict()` or `clip_grad_norm_()` of a name every wrap
    of which shards over every rank, and that call runs a collective."""
    name, func = dotted(call), call.func
    if models.get(name) == "FSDP":
        return _on_world(ctx, call, name, forward=True)
    if isinstance(func, ast.Attribute) and func.attr in ("state_dict", "clip_grad_norm_") \
            and models.get(dotted(func.value)) == "FSDP":
        local = func.attr == "state_dict" and any(
            isinstance(n, (ast.Attribute, ast.Name)) and "LOCAL_STATE_DICT" in
            (n.attr if isinstance(n, ast.Attribute) else n.id) for n in ctx.nodes)
        return _on_world(ctx, call, dotted(func.value), forward=False) and not local
    return False


def _on_world(ctx: Context, call: ast.Call, name: str, forward: bool) -> bool:
    """Every wrap of `name` in the file is on the default group, and one of them is in the
    scope of `call` or a scope around it (not a same-named variable of another function)."""
    wraps = [c for c in ctx.calls_named(*FSDP1, "fully_shard") if bound_by(ctx, c) == name]
    scopes, scope = [], ctx.function_of(call)
    while scope is not ctx.tree:
        scopes.append(scope)
        scope = ctx.function_of(scope)
    scopes.append(ctx.tree)
    if not any(ctx.function_of(c) in scopes for c in wraps) and \
            not _built_by_helper(ctx, scopes[0], call, name, wraps):
        return False
    return all(_world_wrap(c) and (forward or last(dotted(c)) in FSDP1) for c in wraps)


def _built_by_helper(ctx: Context, scope: ast.AST, call: ast.Call, name: str,
                     wraps: list[ast.Call]) -> bool:
    """`name`'s last binding before `call` is a statement of `scope` itself (no branch or
    loop around it, none after the call), `model = setup_model(...)`, and that top-level
    function of the file returns only a name it wraps itself (a wrap among `wraps`)."""
    binds = [n for n in subtree(scope) if isinstance(n, (ast.Assign, ast.AugAssign,
                                                          ast.AnnAssign, ast.For, ast.With))
             and name in {dotted(t) for t in subtree(n) if isinstance(t, (ast.Name,
                          ast.Attribute)) and isinstance(t.ctx, ast.Store)}]
    if not binds or any(b.lineno >= call.lineno for b in binds):
        return False
    last_bind = max(binds, key=lambda b: b.lineno)
    body = getattr(scope, "body", [])
    if last_bind not in body or not isinstance(last_bind, ast.Assign) \
            or not isinstance(last_bind.value, ast.Call) \
            or not isinstance(last_bind.value.func, ast.Name):
        return False
    helper = last_bind.value.func.id
    defs = [n for n in ctx.tree.body if isinstance(n, ast.FunctionDef) and n.name == helper]
    if len(defs) != 1:
        return False
    returned = {dotted(r.value) if r.value is not None else "" for r in subtree(defs[0])
                if isinstance(r, ast.Return)}
    return len(returned) == 1 and any(ctx.function_of(c) is defs[0]
                                      and bound_by(ctx, c) in returned for c in wraps)


def _world_wrap(call: ast.Call) -> bool:
    if last(dotted(call)) in FSDP1 and len(call.args) > 1:
        return False  # FSDP1's process_group, positionally
    for group in GROUPS:
        value = keyword(call, group)
        if value is not None and not (isinstance(value, ast.Constant) and value.value is None):
            return False
    strategy = keyword(call, "sharding_strategy")
    return strategy is None or last(dotted(strategy)) in ONE_GROUP
