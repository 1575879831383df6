"""Saving and loading checkpoints in a multi-rank script."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, keyword, last


def _load_without_map_location(ctx: Context):
    """Not on some ranks only: under `if rank == 0:` GPU 0 is the loading rank's own."""
    if not ctx.distributed:
        return
    for call in ctx.calls_named("load"):
        if dotted(call) == "torch.load" and keyword(call, "map_location") is None \
                and ctx.rank_guard(call) is None:
            yield call, ""


def _load_weights_only_false(ctx: Context):
    """torch >= 2.6 (Phalanx's minimum) loads with `weights_only=True` by default: only
    an explicit `weights_only=False` unpickles arbitrary objects."""
    for call in ctx.calls_named("load"):
        value = keyword(call, "weights_only")
        if dotted(call) == "torch.load" and isinstance(value, ast.Constant) \
                and value.value is False:
            yield call, ""


def _wrapper_state_dict(ctx: Context):
    wrapped = ctx.assigned_from("DistributedDataParallel", "DDP")
    for call in ctx.calls_named("state_dict"):
        if isinstance(call.func, ast.Attribute) and dotted(call.func.value) in wrapped:
            yield call, f"(keys of `{dotted(call.func.value)}.state_dict()` start with `module.`)"


def _save_on_every_rank(ctx: Context):
    """torch.save on every rank to one shared file: not under a rank guard (its own if,
    an early exit, its callers'), not to a per-rank file name, not into memory."""
    if not ctx.distributed:
        return
    buffers = ctx.assigned_from("BytesIO")
    for call in ctx.calls_named("save"):
        if dotted(call) != "torch.save" or ctx.rank_guard(call) is not None:
            continue
        target = call.args[1] if len(call.args) > 1 else keyword(call, "f")
        if target is not None and (_per_rank(ctx, target, call) or _in_memory(target, buffers)):
            continue
        yield call, ""


def _in_memory(target: ast.AST, buffers: set[str]) -> bool:
    return (isinstance(target, ast.Call) and last(dotted(target)) == "BytesIO") \
        or dotted(target) in buffers


def _per_rank(ctx: Context, target: ast.AST, call: ast.Call) -> bool:
    """`f"ckpt_{rank}.pt"`, `"x" + str(rank)`, or a name assigned such a path before."""
    if ctx.rank_dependent(target):
        return True
    if isinstance(target, (ast.Name, ast.Attribute)):
        name = dotted(target)
        return any(isinstance(n, ast.Assign) and any(dotted(t) == name for t in n.targets)
                   and ctx.rank_dependent(n.value)
                   for stmt in ctx.before(call) for n in ast.walk(stmt))
    return False


RULES = [
    Rule("PX501", "warning", "torch.load without map_location in a multi-rank script: "
         "tensors saved from GPU 0 load onto GPU 0 on every rank.",
         "Pass `map_location=device` (or 'cpu').",
         "dist.init_process_group('nccl')\nstate = torch.load('ckpt.pt', weights_only=True)  # <-",
         "dist.init_process_group('nccl')\n"
         "state = torch.load('ckpt.pt', map_location=device, weights_only=True)",
         _load_without_map_location),
    Rule("PX502", "warning", "torch.load with weights_only=False: it can run arbitrary "
         "code from the file.",
         "Drop `weights_only=False` (torch >= 2.6 loads tensors and plain containers safely "
         "by default), and save only those; keep it only for files you made yourself. Not "
         "fixed automatically: the load may need it.",
         "state = torch.load('ckpt.pt', map_location='cpu', weights_only=False)  # <-",
         "state = torch.load('ckpt.pt', map_location='cpu')",
         _load_weights_only_false),
    Rule("PX503", "warning", "Saving the DDP wrapper's state_dict: every key gets a `module.` "
         "prefix and won't load into the plain model.",
         "Save `model.module.state_dict()`.",
         "model = DDP(net)\ntorch.save(model.state_dict(), 'm.pt')  # <-",
         "model = DDP(net)\ntorch.save(model.module.state_dict(), 'm.pt')", _wrapper_state_dict),
    Rule("PX504", "warning", "torch.save on every rank: N processes write the same file at "
         "once (a torn file).", "Save under `if rank == 0:` (or use a distributed checkpoint).",
         "dist.init_process_group('gloo')\ntorch.save(state, 'ckpt.pt')  # <-",
         "dist.init_process_group('gloo')\nif rank == 0:\n    torch.save(state, 'ckpt.pt')",
         _save_on_every_rank),
]
