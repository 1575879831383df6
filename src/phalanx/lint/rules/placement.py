"""Where models and tensors live: DataParallel, wrap order, hard-coded GPUs."""

from __future__ import annotations

import ast
from typing import TypeGuard

from phalanx.lint.engine import Context, Rule, dotted, keyword, last
from phalanx.lint.facts import distributed, distributed_program, holds, uses_rpc

MULTI_PROCESS = {"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP",
                 "fully_shard", "init_process_group"}


def _data_parallel(ctx: Context):
    """nn.DataParallel in a distributed program (the file, or a linted file importing
    it, sets up several processes) — not on a branch that is the alternative to one
    building DDP/FSDP or the process group (`if args.distributed: DDP … else: DataParallel`)."""
    if not distributed_program(ctx):
        return
    for call in ctx.calls_named("DataParallel"):
        if not _alternative_to_multi_process(ctx, call):
            yield call, ""


def _alternative_to_multi_process(ctx: Context, node: ast.AST) -> bool:
    """`node` is on one side of an `if`/`elif`/`else` chain or a conditional expression
    (in its own function) whose other side builds DDP/FSDP or the process group."""
    child = node
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            body = parent.body if isinstance(parent, ast.If) else [parent.body]
            orelse = parent.orelse if isinstance(parent, ast.If) else [parent.orelse]
            other = orelse if child in body else body
            if any(last(dotted(c)) in MULTI_PROCESS for s in other for c in ast.walk(s)
                   if isinstance(c, ast.Call)):
                return True
        child = parent
    return False


def _moves(node: ast.AST) -> TypeGuard[ast.Call]:
    return isinstance(node, ast.Call) and last(dotted(node)) in ("to", "cuda", "to_empty")


def _moved_before(ctx: Context, name: str, line: int, scope: ast.AST) -> bool:
    """`name.to(...)` / `.cuda()` before `line`, or `name = <something>.to(...)`."""
    for node in ast.walk(scope):
        if getattr(node, "lineno", line + 1) > line:
            continue
        if _moves(node) and isinstance(node.func, ast.Attribute) \
                and dotted(node.func.value) == name:
            return True
        if isinstance(node, ast.Assign) and _moves(node.value) and \
                any(dotted(t) == name for t in node.targets):
            return True
    return False


def _wrap_before_move(ctx: Context):
    """DDP(model) where `model` is moved only after the wrap, or is wrapped with
    `device_ids` (a GPU is meant) straight from a constructor (`MyModel()` builds on the
    CPU) with no move in between. A model from a factory function may already be placed,
    and an argument that is itself a call (`DDP(copy.deepcopy(m))`) cannot be judged."""
    if not ctx.uses_cuda:
        return
    for call in ctx.calls_named("DistributedDataParallel", "DDP"):
        if not call.args or isinstance(call.args[0], ast.Call):
            continue
        name, scope = dotted(call.args[0]), ctx.function_of(call)
        if not name or _moved_before(ctx, name, call.lineno, scope):
            continue
        ids = keyword(call, "device_ids")
        gpu_meant = ids is not None and not (isinstance(ids, ast.Constant) and ids.value is None)
        if _moved_after(name, call.lineno, scope) or \
                gpu_meant and _built_by_constructor(name, call.lineno, scope):
            yield call, f"(`{name}` is not moved to a device before)"


def _built_by_constructor(name: str, line: int, scope: ast.AST) -> bool:
    """The last assignment to `name` before `line` calls a class (`Net(...)`) that is not
    told a device (`Net(device)`, `Net(rank)` may place itself)."""
    assigns = [n for n in ast.walk(scope) if isinstance(n, ast.Assign) and n.lineno < line
               and any(dotted(t) == name for t in n.targets)]
    if not assigns:
        return False
    value = max(assigns, key=lambda n: n.lineno).value
    told = any(w in ast.unparse(a).lower() for a in [*value.args, *value.keywords]
               for w in ("device", "cuda", "rank")) if isinstance(value, ast.Call) else True
    return isinstance(value, ast.Call) and last(dotted(value))[:1].isupper() and not told


def _moved_after(name: str, line: int, scope: ast.AST) -> bool:
    return any(_moves(n) and isinstance(n.func, ast.Attribute) and dotted(n.func.value) == name
               and n.lineno > line for n in ast.walk(scope))


def _hard_coded_device(ctx: Context):
    """`cuda:N` literals, and `.cuda()` with no device chosen per rank — not in a model
    driven through RPC (each side places its own tensors) or a one-process test."""
    if not distributed(ctx) or uses_rpc(ctx):
        return
    for node in ctx.nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith("cuda:") and node.value[5:].isdigit():
            yield node, f"(`{node.value}`)"
    has_set_device = holds(ctx, "set_device")
    for call in ctx.calls_named("cuda"):
        if isinstance(call.func, ast.Attribute) and not call.args and not has_set_device \
                and dotted(call.func.value) != "torch":
            yield call, "(`.cuda()` without torch.cuda.set_device: every rank uses GPU 0)"


def _missing_set_device(ctx: Context):
    """init_process_group where neither this file nor a linted file connected to it by
    imports chooses the rank's GPU (`set_device` under any alias, `set_device_index`,
    `with torch.cuda.device(...)`, a per-rank CUDA_VISIBLE_DEVICES)."""
    if not (distributed(ctx) and ctx.uses_cuda) or holds(ctx, "set_device"):
        return
    for call in ctx.calls_named("init_process_group"):
        yield call, ""


def _batch_names(loop: ast.For) -> list[str]:
    """`x, y` of `for x, y in loader` / `for i, (x, y) in enumerate(loader)`."""
    target, source = loop.target, loop.iter
    if isinstance(source, ast.Call) and last(dotted(source)) == "enumerate" and source.args:
        source = source.args[0]
    if not any(word in ast.unparse(source).lower() for word in ("loader", "data", "batch")):
        return []  # not a data loop: `for name, p in model.named_parameters()`
    if isinstance(loop.iter, ast.Call) and last(dotted(loop.iter)) == "enumerate" \
            and isinstance(target, ast.Tuple) and len(target.elts) == 2:
        target = target.elts[1]
    if not isinstance(target, ast.Tuple):
        return []
    return [e.id for e in target.elts if isinstance(e, ast.Name) and e.id != "_"]


def _partly_moved_batch(ctx: Context):
    """A loop that moves some of the batch's tensors to the device but not the others
    (not in a model driven through RPC: its inputs stay on the CPU by design)."""
    if uses_rpc(ctx):
        return
    for loop in (n for n in ctx.nodes if isinstance(n, ast.For)):
        names = _batch_names(loop)
        if len(names) < 2:
            continue
        body = [n for stmt in loop.body for n in ast.walk(stmt)]
        moved = _moved_names(body) & set(names)
        if not moved:
            continue
        for name in names:
            if name in moved:
                continue
            use = next((n for n in body if isinstance(n, ast.Name) and n.id == name
                        and _used_as_tensor(ctx, n)), None)
            if use is not None:
                yield use, (f"(`{', '.join(sorted(moved))}` moved to the device, "
                            f"`{name}` not)")


def _moved_names(body: list[ast.AST]) -> set[str]:
    """Names whose tensors the loop body moves: `x.to(d)`, `x = <anything that moves>`
    (`batch = {k: v.to(d) for k, v in batch.items()}`), `x[k] = <...moves>` (`for k in
    batch: batch[k] = batch[k].to(d)`), or `x` given to a helper that says it moves
    (`to_device(batch, d)`, `move_to(batch, d)`)."""
    moved = {dotted(n.func.value) for n in body if _moves(n)
             and isinstance(n.func, ast.Attribute)}
    for node in body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                moved |= _assigned_moved(target, node.value)
        if isinstance(node, ast.Call) and any(w in last(dotted(node)).lower()
                                              for w in ("device", "move")):
            moved |= {dotted(a) for a in node.args}
    return moved - {""}


def _assigned_moved(target: ast.expr, value: ast.expr) -> set[str]:
    """The names `target = value` gives a moved tensor: `x, y = x.to(d), y` → {x}."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and \
            len(target.elts) == len(value.elts):
        return {n for t, v in zip(target.elts, value.elts) for n in _assigned_moved(t, v)}
    if not any(_moves(n) for n in ast.walk(value)):
        return set()
    while isinstance(target, ast.Subscript):  # batch[k] = batch[k].to(d)
        target = target.value
    return {dotted(e) for e in (target.elts if isinstance(target, ast.Tuple) else [target])}


def _used_as_tensor(ctx: Context, name: ast.Name) -> bool:
    """Passed to a call other than len()/print(), and not just asked for its shape."""
    parent = ctx.parents.get(name)
    if isinstance(parent, ast.Attribute):
        return False  # y.shape, y.size(0), y.to(...) elsewhere
    return isinstance(parent, ast.Call) and name in parent.args and \
        last(dotted(parent)) not in ("len", "print", "isinstance", "type")


RULES = [
    Rule("PX101", "warning", "nn.DataParallel: single-process, slower than DDP and not "
         "multi-node.", "Use DistributedDataParallel with one process per GPU (torchrun).",
         "dist.init_process_group('nccl')\nmodel = nn.DataParallel(model)  # <-",
         "dist.init_process_group('nccl')\n"
         "model = DDP(model.to(device), device_ids=[local_rank])", _data_parallel),
    Rule("PX102", "error", "DDP wraps a model that is not on its device yet.",
         "Move first: `DDP(model.to(device), device_ids=[local_rank])`.",
         "import torch\nmodel = Net()\nmodel = DDP(model)  # <-\nmodel.to('cuda')",
         "import torch\nmodel = Net().to('cuda')\nmodel = DDP(model)", _wrap_before_move),
    Rule("PX103", "warning", "A hard-coded GPU in a distributed script: every rank uses the "
         "same device.", "Use `torch.device('cuda', local_rank)` from LOCAL_RANK.",
         "dist.init_process_group('nccl')\nx = x.to('cuda:0')  # <-",
         "dist.init_process_group('nccl')\ntorch.cuda.set_device(local_rank)\n"
         "x = x.to(f'cuda:{local_rank}')", _hard_coded_device),
    Rule("PX104", "warning", "No torch.cuda.set_device: ranks may create contexts on GPU 0.",
         "Call `torch.cuda.set_device(local_rank)` before init_process_group.",
         "import torch.distributed as dist\ndist.init_process_group('nccl')  # <-\n"
         "model.cuda(local_rank)",
         "import torch.distributed as dist\ntorch.cuda.set_device(local_rank)\n"
         "dist.init_process_group('nccl')", _missing_set_device),
    Rule("PX105", "warning", "Only part of the batch is moved to the device: the loss mixes "
         "devices (\"Expected all tensors to be on the same device\").",
         "Move every tensor of the batch: `x, y = x.to(device), y.to(device)`.",
         "for x, y in loader:\n    out = model(x.to(device))\n    loss = loss_fn(out, y)  # <-",
         "for x, y in loader:\n    x, y = x.to(device), y.to(device)\n"
         "    loss = loss_fn(model(x), y)", _partly_moved_batch),
]
