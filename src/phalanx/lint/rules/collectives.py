"""Collectives that only some ranks reach: the others wait forever (a deadlock).

Also the collectives that do not look like one: the forward of a DDP model (it
broadcasts buffers) or of an FSDP model (it all-gathers parameters), an FSDP model's
`state_dict()` and `clip_grad_norm_`, `DTensor.full_tensor()`, DCP's save/load and
state-dict helpers, ZeRO's `consolidate_state_dict` — directly, or through helper
functions of this file or of the other files linted with it (`Context.project`)."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, keyword, last, rank_dependent

COLLECTIVES = {"all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
               "reduce", "reduce_scatter", "reduce_scatter_tensor", "broadcast",
               "broadcast_object_list", "barrier", "gather", "gather_object", "scatter",
               "scatter_object_list", "all_to_all", "all_to_all_single", "monitored_barrier"}


DCP_CALLS = {"get_state_dict", "get_model_state_dict", "get_optimizer_state_dict",
             "set_state_dict", "set_model_state_dict", "set_optimizer_state_dict", "async_save"}
WRAPPERS = {"DistributedDataParallel": "DDP", "DDP": "DDP", "FullyShardedDataParallel": "FSDP",
            "FSDP": "FSDP", "fully_shard": "FSDP"}


def wrapped(ctx: Context) -> dict[str, str]:
    """Names holding a DDP / FSDP model: `m = DDP(...)`, `m = FSDP(...)`, `fully_shard(m)`.
    A DDP built with `broadcast_buffers=False` has a forward without a collective."""
    found: dict[str, str] = {}
    for call in ctx.calls_named(*WRAPPERS):
        kind = WRAPPERS[last(dotted(call))]
        parent = ctx.parents.get(call)
        if kind == "DDP" and isinstance(buffers := keyword(call, "broadcast_buffers"),
                                        ast.Constant) and buffers.value is False:
            continue
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
            found[dotted(parent.targets[0])] = kind
        elif last(dotted(call)) == "fully_shard" and call.args:
            found[dotted(call.args[0])] = kind
    found.pop("", None)
    return found


def hidden(call: ast.Call, models: dict[str, str]) -> str | None:
    """The collective `call` runs without being named one, or None."""
    name, func = dotted(call), call.func
    if name in models:
        return (f"the forward of the {models[name]} model `{name}` ("
                + ("broadcasts buffers" if models[name] == "DDP" else "all-gathers parameters")
                + ")")
    if not isinstance(func, ast.Attribute):
        return None
    receiver, method = dotted(func.value), func.attr
    if method in ("state_dict", "clip_grad_norm_") and models.get(receiver) == "FSDP":
        return f"`{receiver}.{method}()` of an FSDP model (a collective)"
    if method == "full_tensor":
        return "`full_tensor()` (an all-gather)"
    if method == "consolidate_state_dict":
        return "`consolidate_state_dict()` (ZeRO gathers the optimizer state)"
    if method in DCP_CALLS or (method in ("save", "load") and last(receiver) in ("dcp", "checkpoint")
                               and "torch.save" != name):
        return f"`{name}()` (DCP: collectives across ranks)"
    return None


def collective_functions(ctx: Context) -> dict[str, str]:
    """Functions that (transitively) run a collective → the collective: this file's,
    and the other linted files' (`ctx.project`) that this file calls."""
    calls = {n.name: [c for c in ast.walk(n) if isinstance(c, ast.Call)] for n in ctx.nodes
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    models = wrapped(ctx)
    found: dict[str, str] = {k: v for k, v in ctx.project.items() if k not in calls}
    changed = True
    while changed:
        changed = False
        for name, inside in calls.items():
            if name in found:
                continue
            for call in inside:
                what = _runs(ctx, call, models, found, inside=name)
                if what is not None:
                    found[name], changed = what, True
                    break
    return found


def _runs(ctx: Context, call: ast.Call, models: dict[str, str], helpers: dict[str, str],
          inside: str | None = None) -> str | None:
    """The collective `call` runs: a named one, a hidden one, or a known helper's (not
    the function `inside` calling itself)."""
    callee = last(dotted(call))
    if callee in COLLECTIVES and _is_dist_call(ctx, call):
        return callee
    what = hidden(call, models)
    if what is None and callee in helpers and callee != inside and _own(ctx, call):
        what = helpers[callee] if inside is None else f"{helpers[callee]} (via `{callee}()`)"
    return what


def _own(ctx: Context, call: ast.Call) -> bool:
    """A call that can reach a helper known by name: `f()`, `self.f()`, `cls.f()`, or
    `module.f()` of an imported module — not `self.other.f()` (another object's `f`)."""
    if isinstance(call.func, ast.Name):
        return True
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
    return isinstance(receiver, ast.Name) and (receiver.id in ("self", "cls")
                                               or receiver.id in ctx.imported)


def _is_dist_call(ctx: Context, call: ast.Call) -> bool:
    """`dist.all_reduce(...)`, `torch.distributed.barrier()`, or a bare name imported from
    torch.distributed (or not imported at all: a snippet) — not `functools.reduce`, nor
    `some_list.reduce` of another library."""
    name = dotted(call)
    if "." not in name:
        origin = ctx.imported.get(name)
        return origin is None or origin.startswith("torch.distributed")
    return name.split(".")[-2] in ("dist", "distributed", "run", "accelerator")


def _rank_only_collective(ctx: Context):
    if not (ctx.mentions(*COLLECTIVES, *WRAPPERS, *DCP_CALLS, "full_tensor", "save", "load",
                         "consolidate_state_dict") or ctx.project):
        return
    helpers, models = collective_functions(ctx), wrapped(ctx)
    for call in ctx.calls:
        callee = last(dotted(call))
        what = _runs(ctx, call, models, helpers)
        if what is None:
            continue
        cond = ctx.rank_condition(call)
        if cond is not None and not _other_branch_joins(ctx, call, callee) \
                and not _paired(ctx, call, cond, callee):
            test = ast.unparse(cond.test)
            shown = what if "`" in what else f"`{what}`"
            yield call, (f"({shown} under `if {test}:` at line {cond.lineno}: the other "
                         f"ranks never join it)")


def _other_branch_joins(ctx: Context, call: ast.Call, callee: str) -> bool:
    """`if rank == src: broadcast(x, src) else: broadcast(y, src)` — every rank joins: at
    some enclosing rank condition, the other branch calls the same collective (or helper)."""
    child: ast.AST = call
    for parent in ctx.ancestors(call):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        if isinstance(parent, ast.If) and child is not parent.test and \
                rank_dependent(parent.test):
            other = parent.orelse if child in parent.body else parent.body
            if any(isinstance(n, ast.Call) and last(dotted(n)) == callee
                   for s in other for n in ast.walk(s)):
                return True
        child = parent
    return False


def _paired(ctx: Context, call: ast.Call, cond: ast.If | ast.IfExp, callee: str) -> bool:
    """"Rank 0 first": `if rank > 0: barrier()` … `if rank == 0: barrier()` — the same
    collective under another rank condition in the same function: each rank joins one."""
    scope = ctx.function_of(call)
    for other in ast.walk(scope):
        if isinstance(other, ast.Call) and other is not call and last(dotted(other)) == callee:
            theirs = ctx.rank_condition(other)
            if theirs is not None and theirs is not cond and \
                    ast.unparse(theirs.test) != ast.unparse(cond.test):
                return True
    return False


RULES = [
    Rule("PX301", "error", "A collective reachable only on some ranks: a deadlock.",
         "Run the collective on every rank; keep only the printing/saving under the rank "
         "condition.",
         "def log_metrics(loss):\n    dist.all_reduce(loss)\n    print(loss.item())\n\n"
         "if rank == 0:\n    log_metrics(loss)  # <-",
         "def log_metrics(loss):\n    dist.all_reduce(loss)\n    return loss.item()\n\n"
         "value = log_metrics(loss)\nif rank == 0:\n    print(value)", _rank_only_collective),
]
