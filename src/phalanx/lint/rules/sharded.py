"""Sharded strategies: FSDP1 (`FullyShardedDataParallel`), FSDP2 (`fully_shard`) and
ZeRO (`ZeroRedundancyOptimizer`) — the order of wrapping and optimizer, clipping,
reduction precision and optimizer state dicts. (Their hidden collectives under a rank
condition are PX301's.)"""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, keyword, last

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
    for name, wrap in _wraps(ctx):
        scope = ctx.function_of(wrap)
        for call in (n for n in ast.walk(scope) if isinstance(n, ast.Call)):
            if call.lineno < wrap.lineno and "optim" in dotted(call) and any(
                    isinstance(a, ast.Call) and dotted(a) == f"{name}.parameters"
                    for a in ast.walk(call)):
                yield call, (f"(built at line {call.lineno} on `{name}.parameters()`; "
                             f"`{last(dotted(wrap))}` at line {wrap.lineno} replaces them "
                             f"with flat or sharded ones, which this optimizer never updates)")


def _plain_clip_on_fsdp1(ctx: Context):
    names = ctx.assigned_from(*FSDP1)
    for call in ctx.calls_named("clip_grad_norm_"):
        if not (dotted(call).endswith("utils.clip_grad_norm_") and call.args):
            continue
        params = call.args[0]
        if isinstance(params, ast.Call) and isinstance(params.func, ast.Attribute) \
                and params.func.attr == "parameters":
            params = params.func.value
        if dotted(params) in names:
            yield call, "(each rank sees only its shards: a different norm on every rank)"


def _low_precision_reduce(ctx: Context):
    for call in ctx.calls_named("MixedPrecision", "MixedPrecisionPolicy"):
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
        if isinstance(call.func, ast.Attribute) and dotted(call.func.value) in zero:
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
         "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)  # <-",
         "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
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
