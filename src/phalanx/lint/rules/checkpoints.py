"""Saving and loading checkpoints in a multi-rank script."""

from __future__ import annotations

import ast
import re

from phalanx.lint.bindings import may_reach, parameters
from phalanx.lint.engine import Context, Rule, calls_in, dotted, keyword, last
from phalanx.lint.syntax import subtree, walk
from phalanx.lint.targets import own_target


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


DDP_NAMES = {"DistributedDataParallel", "DDP"}
SAVERS = {"save", "save_file"}  # torch.save, safetensors' save_file, `x.save(...)`
STRIPS = {"replace", "startswith", "removeprefix", "lstrip", "len", "sub"}
PREFIX = re.compile(r"^\^?module\\?\.$")


def strips_module_prefix(tree: ast.AST) -> bool:
    """The code strips DDP's `module.` prefix somewhere: the string "module." given to
    `replace`/`startswith`/`removeprefix`/`lstrip`/`len`/`re.sub`, or sliced off."""
    for node in walk(tree):
        if isinstance(node, ast.Call) and last(dotted(node)) in STRIPS and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str)
                and PREFIX.match(a.value) for a in node.args):
            return True
    return False


def _wraps(value: ast.expr | None) -> bool:
    """`DDP(net)`, `DDP(net).to(device)`: a value holding the DDP wrapper."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in ("to", "cuda"):
        value = value.func.value
    return isinstance(value, ast.Call) and last(dotted(value)) in DDP_NAMES


def _saving_functions(ctx: Context) -> set[str]:
    """This file's functions that pass one of their parameters to a save (the
    `save_checkpoint(state, ...)` of a training script), and those calling them so."""
    found: set[str] = set()
    for _ in range(2):
        for func in (n for n in ctx.of(ast.FunctionDef, ast.AsyncFunctionDef)):
            params = parameters(func)
            if any(_is_save(c, found) and any(isinstance(n, ast.Name) and n.id in params
                                               for a in c.args for n in walk(a))
                   for c in subtree(func) if isinstance(c, ast.Call)):
                found.add(func.name)
    return found


def _is_save(call: ast.Call, savers: set[str]) -> bool:
    """`torch.save(...)`, `x.save(...)`, `save_file(...)`, or a call of one of `savers`
    (this file's functions that save their parameter: `f(...)`, `self.f(...)`)."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr in SAVERS or (dotted(func.value) in ("self", "cls")
                                       and func.attr in savers)
    return isinstance(func, ast.Name) and (func.id in savers or func.id == "save_file")


def _reaches_save(ctx: Context, call: ast.Call, savers: set[str]) -> bool:
    """The state dict `call` returns is given to a save: as an argument (inside a dict or
    list literal, too), or through the name it is assigned to, saved later."""
    node: ast.AST = call
    parent = ctx.parents.get(node)
    while isinstance(parent, (ast.Dict, ast.List, ast.Tuple, ast.keyword, ast.Starred)):
        node, parent = parent, ctx.parents.get(parent)
    if isinstance(parent, ast.Call) and parent.func is not node:
        return _is_save(parent, savers)
    if not isinstance(parent, ast.Assign):
        return False
    names = {dotted(t) for t in parent.targets} - {""}
    return any(_is_save(c, savers) and any(dotted(n) in names for a in [*c.args, *(
        k.value for k in c.keywords)] for n in walk(a))
        for c in calls_in(ctx.after(parent)))


def _wrapper_state_dict(ctx: Context):
    """`model.state_dict()` saved while `model` holds the DDP wrapper (per scope and
    flow: not a local of the same name, not before the wrap) — unless the linted code
    strips the `module.` prefix somewhere (it loads such checkpoints on purpose)."""
    stripped = ctx.module_prefix_stripped
    if not ctx.mentions(*DDP_NAMES) or (stripped if stripped is not None
                                        else strips_module_prefix(ctx.tree)):
        return
    savers = _saving_functions(ctx)
    for call in ctx.calls_named("state_dict"):
        if not isinstance(call.func, ast.Attribute) or \
                not isinstance(call.func.value, (ast.Name, ast.Attribute)):
            continue
        _, found = may_reach(ctx, call.func.value, call)
        if any(_wraps(value) for _, value in found) and _reaches_save(ctx, call, savers):
            yield call, f"(keys of `{dotted(call.func.value)}.state_dict()` start with `module.`)"


def _save_on_every_rank(ctx: Context):
    """torch.save on every rank to one shared file: not under a rank guard (its own if,
    an early exit, its callers'), not to a file or buffer of the process's own
    (lint.targets: rank-named, in memory, temporary)."""
    if not ctx.distributed:
        return
    for call in ctx.calls_named("save"):
        if dotted(call) != "torch.save" or ctx.rank_guard(call) is not None:
            continue
        target = call.args[1] if len(call.args) > 1 else keyword(call, "f")
        if target is not None and own_target(ctx, target, call):
            continue
        yield call, ""


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
