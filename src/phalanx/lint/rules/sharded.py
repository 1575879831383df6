"""Sharded strategies: FSDP1 (`FullyShardedDataParallel`), FSDP2 (`fully_shard`) and
ZeRO (`ZeroRedundancyOptimizer`) — the order of wrapping and optimizer, clipping,
reduction precision and optimizer state dicts. (Their hidden collectives under a rank
condition are PX301's.)"""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, keyword, last
from phalanx.lint.facts import named_elsewhere
from phalanx.lint.syntax import subtree, walk

FSDP1 = {"FullyShardedDataParallel", "FSDP"}
LOW = {"float16", "bfloat16", "half", "bf16", "fp16"}


def _wraps(ctx: Context) -> list[tuple[str, ast.Call]]:
    """(model name, the call) for `m = FSDP(m, ...)` and `fully_shard(m)`."""
    found = []
    for call in ctx.calls_named(*FSDP1, "fully_shard"):
        parent = ctx.parents.get(call)
        if last(dotted(call)) == "fully_shard" and call.args:
            found.append((dotted(call.args[0]), call))
        elif isinstance(parent, ast.Assign) and call.args:
            found.append((dotted(call.args[0]), call))
    return [(name, call) for name, call in found if name]


def _optimizer_before_wrap(ctx: Context):
    """An optimizer built on `m.parameters()` earlier in the wrap's own scope (not in a
    function defined there, which may run later), and not built again after the wrap."""
    for name, wrap in _wraps(ctx):
        scope = ctx.function_of(wrap)
        built = [n for n in subtree(scope) if isinstance(n, ast.Call)
                 and ctx.function_of(n) is scope and "optim" in dotted(n)
                 and any(isinstance(a, ast.Call) and dotted(a) == f"{name}.parameters"
                         for a in walk(n))]
        if any(call.lineno > wrap.lineno for call in built):
            continue  # rebuilt on the wrapped model's parameters
        for call in built:
            if call.lineno < wrap.lineno:
                yield call, (f"(built at line {call.lineno} on `{name}.parameters()`; "
                             f"`{last(dotted(wrap))}` at line {wrap.lineno} replaces them "
                             f"with flat or sharded ones, which this optimizer never updates)")


def _bound_here(ctx: Context, name: str, node: ast.AST, *classes: str) -> bool:
    """`name` is assigned from one of `classes` in `node`'s own scope — or, for
    `self.x`, in a method of `node`'s class: not a same-named variable of another
    function."""
    scope = ctx.function_of(node)
    owner = ctx.parents.get(scope) if name.startswith("self.") else None
    for call in ctx.calls_named(*classes):
        parent = ctx.parents.get(call)
        if not (isinstance(parent, ast.Assign) and any(dotted(t) == name
                                                        for t in parent.targets)):
            continue
        theirs = ctx.function_of(call)
        if theirs is scope or (isinstance(owner, ast.ClassDef)
                               and ctx.parents.get(theirs) is owner):
            return True
    return False


def _plain_clip_on_fsdp1(ctx: Context):
    names = ctx.assigned_from(*FSDP1)
    for call in ctx.calls_named("clip_grad_norm_"):
        if not (dotted(call).endswith("utils.clip_grad_norm_") and call.args):
            continue
        params = call.args[0]
        if isinstance(params, ast.Call) and isinstance(params.func, ast.Attribute) \
                and params.func.attr == "parameters":
            params = params.func.value
        if dotted(params) in names and _bound_here(ctx, dotted(params), call, *FSDP1):
            yield call, "(each rank sees only its shards: a different norm on every rank)"


def _passed_on(ctx: Context, call: ast.Call) -> bool:
    """The policy reaches a wrapper: an argument (or part of one), returned, or assigned
    to a name some linted file reads (`mp = …` then `FSDP(m, mixed_precision=mp)`, or
    `policies.mp` from another file) — not a definition nothing uses."""
    node: ast.AST = call
    while (parent := ctx.parents.get(node)) is not None:
        if isinstance(parent, (ast.Dict, ast.Tuple, ast.List, ast.IfExp, ast.Starred)):
            node = parent
        elif isinstance(parent, (ast.Assign, ast.AnnAssign)):
            targets: list[ast.expr] = [*parent.targets] if isinstance(parent, ast.Assign) \
                else [parent.target]
            return any(_read(ctx, name, targets) for t in targets for name in _names(t))
        else:
            return not isinstance(parent, ast.Expr)
    return True


def _names(target: ast.expr) -> list[str]:
    """The names an assignment target binds or changes: `mp`, `self.mp` → mp,
    `kwargs["mp_policy"]` → kwargs, `a, b` → both."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _names(e)]
    while isinstance(target, ast.Subscript):
        target = target.value
    return [last(dotted(target))] if dotted(target) else []


def _read(ctx: Context, name: str, targets: list[ast.expr]) -> bool:
    """`name` is read in this file (outside the assignment's own targets) or named in
    another linted file (lint.facts.named_elsewhere)."""
    skip = {id(n) for t in targets for n in walk(t)}
    for node in ctx.nodes:
        load = isinstance(getattr(node, "ctx", None), ast.Load) and id(node) not in skip
        if load and (isinstance(node, ast.Name) and node.id == name or
                     isinstance(node, ast.Attribute) and node.attr == name):
            return True
    return named_elsewhere(ctx, name)


def _low_precision_reduce(ctx: Context):
    for call in ctx.calls_named("MixedPrecision", "MixedPrecisionPolicy"):
        if not _passed_on(ctx, call):
            continue
        param, reduce = keyword(call, "param_dtype"), keyword(call, "reduce_dtype")
        low = [n for n in (reduce,) if n is not None and last(dotted(n)) in LOW]
        if low or (reduce is None and param is not None and last(dotted(param)) in LOW):
            if reduce is not None:
                shown = ast.unparse(reduce)
            else:  # then param is a low dtype (the condition above)
                assert param is not None
                shown = f"{ast.unparse(param)} (reduce_dtype defaults to param_dtype)"
            yield call, f"(gradients are summed across ranks in {shown})"


def _zero_state_dict(ctx: Context):
    zero = ctx.assigned_from("ZeroRedundancyOptimizer")
    if not zero or ctx.mentions("consolidate_state_dict"):
        return
    for call in ctx.calls_named("state_dict"):
        receiver = dotted(call.func.value) if isinstance(call.func, ast.Attribute) else ""
        if receiver in zero and _bound_here(ctx, receiver, call, "ZeroRedundancyOptimizer"):
            yield call, ""


RULES = [
    Rule("PX106", "error", "An optimizer built before FSDP wraps the model: it holds the "
         "parameters FSDP replaces.", "Wrap first (`fully_shard` / `FSDP(...)`), then build "
         "the optimizer on the wrapped model's parameters (or `run.setup`).",
         "opt = torch.optim.AdamW(model.parameters())  # <-\nmodel = FSDP(model)",
         "model = FSDP(model)\nopt = torch.optim.AdamW(model.parameters())",
         _optimizer_before_wrap, family="sharded"),
    Rule("PX107", "error", "`torch.nn.utils.clip_grad_norm_` on an FSDP1 model clips by each "
         "rank's local norm.", "Call the model's own `model.clip_grad_norm_(max_norm)` "
         "(FSDP2: `torch.nn.utils.clip_grad_norm_` works on its DTensors).",
         "model = FSDP(net)\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # <-",
         "model = FSDP(net)\nmodel.clip_grad_norm_(1.0)", _plain_clip_on_fsdp1,
         family="sharded"),
    Rule("PX108", "warning", "FSDP mixed precision reduces gradients in 16-bit: the sum over "
         "many ranks loses precision.", "Pass `reduce_dtype=torch.float32` (compute stays "
         "in `param_dtype`).",
         "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)  # <-\n"
         "fully_shard(model, mp_policy=mp)",
         "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n"
         "fully_shard(model, mp_policy=mp)",
         _low_precision_reduce, family="sharded"),
    Rule("PX505", "error", "`ZeroRedundancyOptimizer.state_dict()` without "
         "`consolidate_state_dict()`: it raises, the state is spread over the ranks.",
         "On every rank: `opt.consolidate_state_dict(to=0)`; then on rank 0 "
         "`opt.state_dict()`.",
         "opt = ZeroRedundancyOptimizer(params, torch.optim.AdamW)\n"
         "torch.save(opt.state_dict(), 'opt.pt')  # <-",
         "opt = ZeroRedundancyOptimizer(params, torch.optim.AdamW)\n"
         "opt.consolidate_state_dict(to=0)\nif dist.get_rank() == 0:\n"
         "    torch.save(opt.state_dict(), 'opt.pt')", _zero_state_dict, family="sharded"),
]
