"""Where a name holds a DDP/FSDP model, flow-sensitively: `model` is the wrapper only at
uses its wrapping assignment (`model = DDP(model)`) may reach — not before it, and not
after a rebinding to something else. A binding that re-wraps the name itself
(`model = torch.compile(model)`, `model = model.to(device)`) holds the wrapper when the
name did there; a binding whose value is unknown (a loop target, `x, y = f()`) may hold
it; a name that is a parameter, or bound only at another scope (a module-level model
used in a function, `self.model` bound in another method), is judged as before: by name."""

from __future__ import annotations

import ast
from collections.abc import Collection

from phalanx.lint.bindings import may_reach
from phalanx.lint.engine import Context, dotted, last
from phalanx.lint.syntax import walk

DEPTH = 4  # rebindings followed back through their own values


def holds_wrapper(ctx: Context, expr: ast.expr, use: ast.AST, wrappers: Collection[str],
                  depth: int = DEPTH) -> bool:
    """Whether `expr` (a name or `self.x`) may hold the result of a call of `wrappers`
    (DDP, FSDP …) at `use`."""
    key = (id(expr), id(use))
    memo = ctx.memo.setdefault("wrapping", {})
    if key not in memo:
        memo[key] = _holds(ctx, expr, use, wrappers, depth)
    return memo[key]


def _holds(ctx: Context, expr: ast.expr, use: ast.AST, wrappers: Collection[str],
           depth: int) -> bool:
    where, found = may_reach(ctx, expr, use)
    if where != "local" or depth <= 0:
        return True  # the name's other scopes: as before, by name
    name = dotted(expr)
    for _, value in found:
        if value is None or _wraps(value, wrappers) or _wrapping_helper(ctx, value, wrappers):
            return True
        mentions = [n for n in walk(value) if isinstance(n, (ast.Name, ast.Attribute))
                    and dotted(n) == name]
        if any(holds_wrapper(ctx, n, n, wrappers, depth - 1) for n in mentions):
            return True
    return False


def _wrapping_helper(ctx: Context, value: ast.expr, wrappers: Collection[str]) -> bool:
    """`value` calls a function of this file (`f(...)`, `self.f(...)`) that wraps a model
    itself: `model = create_fsdp_model(model)`."""
    names = {last(dotted(n)) for n in walk(value) if isinstance(n, ast.Call) and (
        isinstance(n.func, ast.Name) or dotted(n.func).startswith(("self.", "cls.")))}
    return bool(names) and any(
        isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in names
        and _wraps(f, wrappers) for f in ctx.nodes)


def _wraps(value: ast.AST, wrappers: Collection[str]) -> bool:
    return any(isinstance(n, ast.Call) and last(dotted(n)) in wrappers
               for n in walk(value))


def bound_by(ctx: Context, call: ast.Call) -> str:
    """The name a wrap call binds: `m = DDP(...)` / `m = FSDP(...)` its target,
    `fully_shard(m)` its first argument; "" when neither."""
    parent = ctx.parents.get(call)
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        return dotted(parent.targets[0])
    if last(dotted(call)) == "fully_shard" and call.args:
        return dotted(call.args[0])
    return ""
