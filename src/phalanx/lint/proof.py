"""What makes a rank-conditional collective an error (PX301) and not a suspicion (PX303).

The analysis reasons with three values: a value *known* on a given global rank (a literal,
`dist.get_rank()`, `int(os.environ["RANK"])`, Accelerate's `process_index`, Fabric's
`global_rank`, Phalanx's `run.rank`, names bound once to one of these, and a function of
the file without parameters that returns one), and *unknown*
(everything else: a parameter, `args.rank`, `local_rank`, a loop variable, a flag). A test
is evaluated on global ranks 0 and 1, which every world of two or more ranks has; an
unknown never becomes a rank and never proves anything.

PX301 is reported only when all three terms are proven:

1. **A rank never reaches the call**: on rank 0 or on rank 1 the guard (the enclosing
   `if`'s test, an early `return` before it, or a decorator that runs the function only
   when its test holds) is *known* to send the rank the other way.
   Then whenever the call runs, it runs on some ranks and not on that one.
2. **The call is a collective over every rank**: a `torch.distributed` collective without
   a `group` (point-to-point `send`/`recv` are not collectives), DCP's `save`/`load`
   without a `process_group`, the forward or `state_dict()` of an FSDP model that every
   wrap in the file shards over the default group (lint.fsdp_world), a collective of
   Phalanx's `Run` (each of its methods says whether it runs one), Accelerate's or
   Fabric's (one that runs on every call), or a function of the same file called by its
   name whose body reaches one of these on its straight path from the entry (no branch,
   loop or exit before or around it) — so a helper whose collective sits behind a
   parameter proves nothing.
3. **The skipped rank joins no matching collective there**: the other side of the guard
   calls nothing that runs a collective, nothing of the same file, nothing named like a
   collective (the rule's earlier checks already leave out `if rank == 0: broadcast(…)
   else: broadcast(…)`, "rank 0 first" barriers and ranks that join before leaving).

What is assumed: a call to a function outside the linted files runs no collective unless
its name is a collective's (the third term), and the world has at least two ranks.
"""

from __future__ import annotations

import ast
from collections.abc import Callable

from phalanx.lint.callees import dcp_call
from phalanx.lint.engine import Context, dotted, keyword, last
from phalanx.lint.fsdp_world import fsdp_collective
from phalanx.lint.guards import Guard
from phalanx.lint.libraries import library_receivers
from phalanx.lint.runapi import run_call, run_receivers
from phalanx.lint.syntax import children, subtree

UNKNOWN = object()
DEPTH = 4  # names and helpers followed this deep
# Accelerate's and Fabric's methods that run a collective on every call (each receiver's
# own table decides whose: Accelerate's `save` is local, Fabric's ends with a barrier)
LIBRARY_PROVEN = {"wait_for_everyone", "reduce", "gather", "gather_for_metrics",
                  "pad_across_processes", "main_process_first", "local_main_process_first",
                  "barrier", "all_reduce", "all_gather", "broadcast", "save", "load",
                  "rank_zero_first"}
RANK_ATTRIBUTES: dict[str, Callable[[int], object]] = {
    "process_index": lambda r: r, "global_rank": lambda r: r, "rank": lambda r: r,
    "is_main_process": lambda r: r == 0, "is_global_zero": lambda r: r == 0,
    "is_main": lambda r: r == 0}
STRAIGHT = (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.With,
            ast.AsyncWith, ast.Call, ast.keyword, ast.Await, ast.Attribute, ast.Subscript,
            ast.Tuple, ast.List, ast.Starred, ast.Dict, ast.withitem)
LEAVES = (ast.Return, ast.Raise, ast.Break, ast.Continue)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def prove(ctx: Context, call: ast.Call, guards: list[Guard], collectives: set[str],
          joins: Callable[[ast.Call], bool], models: dict[str, str]) -> tuple[int | None, str]:
    """(the rank proven to skip `call`, "") when PX301's three terms hold under one of its
    `guards`; else (None, the first term not proven, in words). `collectives`: the direct
    collectives' names; `joins(c)`: whether call `c` may run a collective (the rule's own
    analysis); `models`: the names holding a wrapped model where `call` is."""
    if not _proven_collective(ctx, call, collectives, DEPTH, models):
        return None, ("what it calls is not proven to run a collective over every rank (a "
                      "helper whose collective may not run, a subgroup, a library method "
                      "or a model's forward)")
    reasons = []
    for guard in guards:
        if guard.kind not in ("if", "return", "decorator"):
            continue
        rank = skipped_rank(ctx, guard)
        if rank is None:
            reasons.append(f"`{ast.unparse(guard.test)}` is not known to send rank 0 or "
                           f"rank 1 the other way")
            continue
        other = _other_side(guard)
        joining = next((c for c in _calls(other) if joins(c)
                        or last(dotted(c)) in collectives or dotted(c) in ctx.defined), None)
        if joining is None:
            return rank, ""
        reasons.append(f"the other side of `{ast.unparse(guard.test)}` calls "
                       f"`{dotted(joining) or ast.unparse(joining.func)}()`, which may join it")
    return None, reasons[0] if reasons else "its rank condition is not in the same function"


def skipped_rank(ctx: Context, guard: Guard) -> int | None:
    """Rank 0 or 1 when the guard is known to send that rank away from the guarded code."""
    for rank in (0, 1):
        truth = _truth(ctx, guard.test, rank, DEPTH)
        if truth is not UNKNOWN and truth != guard.holds:
            return rank
    return None


def _other_side(guard: Guard) -> list[ast.stmt]:
    cond = guard.cond
    if isinstance(cond, ast.IfExp):  # `a() if rank == 0 else b()`
        return [ast.Expr(cond.orelse if guard.holds else cond.body)]
    if guard.kind == "return":  # the ranks that leave run the exiting block
        return cond.body if not guard.holds else cond.orelse
    return cond.orelse if guard.holds else cond.body


def _calls(statements: list[ast.stmt]) -> list[ast.Call]:
    return [n for s in statements for n in subtree(s) if isinstance(n, ast.Call)]


def _truth(ctx: Context, test: ast.AST, rank: int, depth: int) -> object:
    """The truth of `test` on `rank`: True, False or UNKNOWN (and/or by truthiness)."""
    if isinstance(test, ast.BoolOp):
        values = [_truth(ctx, v, rank, depth) for v in test.values]
        decisive = isinstance(test.op, ast.Or)  # or: one true decides; and: one false
        if decisive in values:
            return decisive
        return UNKNOWN if UNKNOWN in values else not decisive
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _truth(ctx, test.operand, rank, depth)
        return inner if inner is UNKNOWN else not inner
    value = _value(ctx, test, rank, depth)
    return value if value is UNKNOWN else bool(value)


def _value(ctx: Context, node: ast.AST, rank: int, depth: int) -> object:
    """`node`'s value on global rank `rank`, or UNKNOWN."""
    if depth < 0:
        return UNKNOWN
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        bound = _single_binding(ctx, node)
        return UNKNOWN if bound is None else _value(ctx, bound, rank, depth - 1)
    if isinstance(node, ast.Compare):
        return _compare(ctx, node, rank, depth)
    if isinstance(node, ast.BinOp):
        left, right = (_value(ctx, n, rank, depth) for n in (node.left, node.right))
        return _arithmetic(node.op, left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _value(ctx, node.operand, rank, depth)
        return -inner if isinstance(inner, int) else UNKNOWN
    if isinstance(node, (ast.BoolOp, ast.UnaryOp)):
        return _truth(ctx, node, rank, depth)
    if isinstance(node, ast.Attribute):
        return _attribute(ctx, node, rank)
    if isinstance(node, ast.Subscript):  # os.environ["RANK"]
        return str(rank) if _environ_rank(node.value, node.slice) else UNKNOWN
    if isinstance(node, ast.Call):
        return _call_value(ctx, node, rank, depth)
    return UNKNOWN


def _compare(ctx: Context, node: ast.Compare, rank: int, depth: int) -> object:
    if len(node.ops) != 1:
        return UNKNOWN
    left = _value(ctx, node.left, rank, depth)
    right = node.comparators[0]
    op = node.ops[0]
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
        items = [_value(ctx, e, rank, depth) for e in right.elts]
        if left is UNKNOWN or UNKNOWN in items:
            return UNKNOWN
        return (left in items) == isinstance(op, ast.In)
    value = _value(ctx, right, rank, depth)
    if left is UNKNOWN or value is UNKNOWN:
        return UNKNOWN
    compare = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
               ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
               ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}.get(type(op))
    try:
        return UNKNOWN if compare is None else compare(left, value)
    except TypeError:
        return UNKNOWN


def _arithmetic(op: ast.operator, left: object, right: object) -> object:
    if not (isinstance(left, int) and isinstance(right, int)):
        return UNKNOWN
    try:
        return {ast.Add: lambda: left + right, ast.Sub: lambda: left - right,
                ast.Mult: lambda: left * right, ast.Mod: lambda: left % right,
                ast.FloorDiv: lambda: left // right}.get(type(op), lambda: UNKNOWN)()
    except ZeroDivisionError:
        return UNKNOWN


def _attribute(ctx: Context, node: ast.Attribute, rank: int) -> object:
    """`accelerator.process_index`, `fabric.is_global_zero`, `run.rank` on the receivers
    the lint knows hold an Accelerator, a Fabric or Phalanx's Run."""
    receiver = dotted(node.value)
    known = receiver in library_receivers(ctx) or receiver in run_receivers(ctx)
    read = RANK_ATTRIBUTES.get(node.attr)
    return read(rank) if known and read is not None else UNKNOWN


def _call_value(ctx: Context, node: ast.Call, rank: int, depth: int) -> object:
    name = dotted(node)
    if last(name) == "get_rank" and _torch_distributed(ctx, name) and not node.args \
            and keyword(node, "group") is None:
        return rank
    if name == "int" and len(node.args) == 1:
        inner = _value(ctx, node.args[0], rank, depth)
        try:
            return UNKNOWN if inner is UNKNOWN else int(inner)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return UNKNOWN
    if name in ("os.environ.get", "os.getenv") and node.args \
            and _environ_rank(ast.Name("os.environ"), node.args[0]):
        return str(rank)
    func = _local_function(ctx, node)  # `is_main()`: a function returning one value
    if func is not None and not node.args and not node.keywords and not _parameters(func):
        body = [s for s in func.body if not (isinstance(s, ast.Expr)
                                             and isinstance(s.value, ast.Constant))]
        if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
            return _value(ctx, body[0].value, rank, depth - 1)
    return UNKNOWN


def _environ_rank(container: ast.AST, key: ast.AST) -> bool:
    return dotted(container) == "os.environ" and isinstance(key, ast.Constant) \
        and key.value == "RANK"


def _torch_distributed(ctx: Context, name: str) -> bool:
    """`dist.get_rank`, `torch.distributed.get_rank`, or `get_rank` imported from it."""
    root = name.split(".")[0]
    origin = ctx.imported.get(root, "")
    if "." not in name:
        return origin.startswith("torch.distributed")
    if root == "dist" and root not in ctx.imported and root not in ctx.defined:
        return True  # a snippet that does not import it: torch's conventional alias
    return origin.startswith("torch.distributed") or name.startswith("torch.distributed.") \
        or origin == "torch" and name.startswith(f"{root}.distributed.")


def _single_binding(ctx: Context, name: ast.Name) -> ast.expr | None:
    """The value `name` is bound to, when its scope binds it exactly once, by a plain
    assignment (not a parameter, a loop variable or a `global` written elsewhere)."""
    scope = ctx.function_of(name)
    stores = _stores(scope, name.id)
    while not stores and isinstance(scope, FUNCTIONS):  # a closure's: the nearest binder
        if name.id in {a.arg for a in _parameters(scope)} or any(
                isinstance(n, (ast.Global, ast.Nonlocal)) for n in subtree(scope)):
            return None
        scope = ctx.function_of(scope)
        stores = _stores(scope, name.id)
    if isinstance(scope, FUNCTIONS) and name.id in {a.arg for a in _parameters(scope)}:
        return None
    if len(stores) != 1 or _declared_global(ctx, name.id):
        return None
    parent = ctx.parents.get(stores[0])
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        return parent.value
    if isinstance(parent, ast.AnnAssign) and parent.value is not None:
        return parent.value
    return None


def _parameters(func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = func.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs,
            *(x for x in (a.vararg, a.kwarg) if x is not None)]


def _stores(scope: ast.AST, name: str) -> list[ast.AST]:
    """Nodes binding `name` in `scope` itself (nested functions and classes left out)."""
    found: list[ast.AST] = []
    todo = children(scope)
    while todo:
        node = todo.pop()
        if isinstance(node, (*FUNCTIONS, ast.ClassDef, ast.Lambda)):
            if getattr(node, "name", None) == name:
                found.append(node)
            continue
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            found.append(node)
        elif isinstance(node, ast.alias) and (node.asname or node.name) == name:
            found.append(node)
        todo.extend(children(node))
    return found


def _declared_global(ctx: Context, name: str) -> bool:
    """`name` is declared `global` or `nonlocal` somewhere in the file (the names gathered
    once per file)."""
    if "declared_global" not in ctx.memo:
        ctx.memo["declared_global"] = {declared: True for n in ctx.nodes
                                       if isinstance(n, (ast.Global, ast.Nonlocal))
                                       for declared in n.names}
    return name in ctx.memo["declared_global"]


def _proven_collective(ctx: Context, call: ast.Call, collectives: set[str],
                       depth: int, models: dict[str, str]) -> bool:
    """`call` runs a collective over every rank whenever it runs (term 2)."""
    func, callee = call.func, last(dotted(call))
    if fsdp_collective(ctx, call, models):
        return True
    if callee in collectives and _torch_distributed_call(ctx, call):
        return _world(keyword(call, "group"))
    if callee in ("save", "load") and dcp_call(ctx, call):  # DCP's, on the default group
        return _world(keyword(call, "process_group")) and not _true(keyword(call, "no_dist"))
    if isinstance(func, ast.Attribute):
        receiver = dotted(func.value)
        if receiver in run_receivers(ctx):  # Phalanx's own: each says what it runs
            return run_call(call, run_receivers(ctx)) is not None
        table = library_receivers(ctx).get(receiver)
        if table is not None:
            return func.attr in LIBRARY_PROVEN and func.attr in table
        return False
    helper = _local_function(ctx, call)
    return depth > 0 and helper is not None and any(
        _proven_collective(ctx, inner, collectives, depth - 1, models)
        and _straight(ctx, inner, helper)
        for inner in subtree(helper) if isinstance(inner, ast.Call))


def _true(node: ast.expr | None) -> bool:
    return node is not None and not (isinstance(node, ast.Constant) and not node.value)


def _world(group: ast.expr | None) -> bool:
    return group is None or (isinstance(group, ast.Constant) and group.value is None) \
        or dotted(group).endswith("group.WORLD")


def _torch_distributed_call(ctx: Context, call: ast.Call) -> bool:
    name = dotted(call)
    if "." in name:
        return _torch_distributed(ctx, name) or name.split(".")[-2] in ("dist", "distributed")
    return ctx.imported.get(name, "").startswith("torch.distributed")


def _local_function(ctx: Context, call: ast.Call) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function of this file `call` names by a bare name: defined in the scope the
    call is in or an enclosing one (the nearest that binds the name), bound there once
    and by that `def` only."""
    if not isinstance(call.func, ast.Name):
        return None
    name, scope = call.func.id, ctx.function_of(call)
    while True:
        stores = _stores(scope, name)
        if stores:
            found = stores[0]
            return found if len(stores) == 1 and isinstance(found, FUNCTIONS) else None
        if scope is ctx.tree:
            return None
        scope = ctx.function_of(scope)


def _straight(ctx: Context, call: ast.Call, func: ast.AST) -> bool:
    """`call` runs whenever `func` is entered: every node between them is a plain
    statement or expression (no branch, loop, handler, lambda or comprehension), and
    nothing before it on its path can leave the function."""
    for node in ctx.ancestors(call):
        if node is func:
            break
        if not isinstance(node, STRAIGHT):
            return False
    return not any(isinstance(n, LEAVES) or (isinstance(n, ast.Call) and
                                             dotted(n) in ("sys.exit", "exit", "quit"))
                   for s in ctx.before(call) for n in subtree(s))
