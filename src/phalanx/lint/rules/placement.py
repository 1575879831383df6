"""Where models and tensors live: DataParallel, wrap order, hard-coded GPUs."""

from __future__ import annotations

import ast
from typing import TypeGuard

from phalanx.lint.engine import Context, Rule, dotted, keyword, last, whether_distributed
from phalanx.lint.facts import distributed, distributed_program, holds, uses_rpc
from phalanx.lint.rules.collectives import COLLECTIVES
from phalanx.lint.rules.setup import builds_nccl, current_device_used, device_picked_before
from phalanx.lint.syntax import subtree, walk

MULTI_PROCESS = {"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP",
                 "fully_shard", "init_process_group"}
DISTRIBUTED_WORK = MULTI_PROCESS | COLLECTIVES
LOSS_WORDS = ("loss", "criterion", "cross_entropy", "kl_div")  # a loss's callable
JOINS = {"cat", "concat", "concatenate", "stack", "hstack", "vstack"}
SHAPE_ATTRS = {"shape", "size", "dim", "ndim", "numel", "dtype", "device", "is_cuda"}


def _data_parallel(ctx: Context):
    """nn.DataParallel in any script (the seeds' first rule: torch's docs recommend DDP
    over it even on one machine) — not on the single-process side of a branch whose other
    side is distributed (`if args.distributed: DDP … else: DataParallel`:
    `single_process_branch`: the script offers DDP already)."""
    several = distributed_program(ctx)
    for call in ctx.calls_named("DataParallel"):
        if last(dotted(call)) != "DataParallel" or (
                several and single_process_branch(ctx, call) is not None):
            continue
        yield call, "" if several else ("(a single-process script: one process per GPU "
                                        "with DDP is faster even on one machine)")


def single_process_branch(ctx: Context, node: ast.AST) -> ast.If | ast.IfExp | None:
    """The `if`/`elif`/`else` chain or conditional expression (in `node`'s own function)
    on whose single-process side `node` is, if any: its other side builds DDP/FSDP or the
    process group (`if args.distributed: init_process_group(...) else: <node>`), or its
    test is a switch of this file's distributed work (`_switches`) and `node` is on the
    side where the switch is off (`if cfg.enable_fsdp: x.to(local_rank) else: <node>`
    when `if cfg.enable_fsdp and n > 1: dist.all_reduce(...)` is in the file)."""
    child = node
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return None
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test:
            body, orelse = _sides(parent)
            in_body = child in body
            if _runs_distributed(orelse if in_body else body):
                return parent
            switches = vars(ctx).get("_switches")
            if switches is None:  # computed once per file
                switches = ctx._switches = _switches(ctx)  # type: ignore[attr-defined]
            key, positive = _switch_key(parent.test)
            if key in switches and switches[key] == (positive != in_body):
                return parent
        child = parent
    return None


def _sides(branch: ast.If | ast.IfExp) -> tuple[list[ast.AST], list[ast.AST]]:
    if isinstance(branch, ast.If):
        return list(branch.body), list(branch.orelse)
    return [branch.body], [branch.orelse]


def _runs_distributed(statements: list[ast.AST]) -> bool:
    return any(isinstance(c, ast.Call) and last(dotted(c)) in MULTI_PROCESS
               for s in statements for c in walk(s))


def _switch_key(test: ast.AST) -> tuple[str, bool]:
    """(the condition `test` asks, without `not`; whether `test` is true when it is)."""
    positive = True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, positive = test.operand, not positive
    return ast.unparse(test), positive


def _switches(ctx: Context) -> dict[str, bool]:
    """Conditions that turn this file's distributed work on: the test of an `if` (or an
    operand of its `and`) whose one side only runs a collective or sets up DDP/FSDP or
    the process group → the value that turns it on. Not a rank test (`if rank == 0:
    dist.barrier()` picks ranks, not a mode); a condition seen with both values is none."""
    seen: dict[str, set[bool]] = {}
    for branch in ctx.nodes:
        if not isinstance(branch, ast.If):
            continue
        body, orelse = (any(isinstance(c, ast.Call) and last(dotted(c)) in DISTRIBUTED_WORK
                            for s in side for c in walk(s)) for side in _sides(branch))
        if body == orelse:
            continue
        test = branch.test
        parts = test.values if body and isinstance(test, ast.BoolOp) and \
            isinstance(test.op, ast.And) else [test]
        for part in parts:
            if ctx.rank_dependent(part) and not whether_distributed(part):
                continue
            key, positive = _switch_key(part)
            seen.setdefault(key, set()).add(positive == body)
    return {key: values.pop() for key, values in seen.items() if len(values) == 1}


def _moves(node: ast.AST) -> TypeGuard[ast.Call]:
    return isinstance(node, ast.Call) and last(dotted(node)) in ("to", "cuda", "to_empty")


def _moved_before(ctx: Context, name: str, line: int, scope: ast.AST) -> bool:
    """`name.to(...)` / `.cuda()` before `line`, or `name = <something>.to(...)`."""
    for node in subtree(scope):
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
        if _moved_after(ctx, name, call.lineno, scope) or \
                gpu_meant and _built_by_constructor(name, call.lineno, scope):
            yield call, f"(`{name}` is not moved to a device before)"


def _built_by_constructor(name: str, line: int, scope: ast.AST) -> bool:
    """The last assignment to `name` before `line` calls a class (`Net(...)`) that is not
    told a device (`Net(device)`, `Net(rank)` may place itself)."""
    assigns = [n for n in subtree(scope) if isinstance(n, ast.Assign) and n.lineno < line
               and any(dotted(t) == name for t in n.targets)]
    if not assigns:
        return False
    value = max(assigns, key=lambda n: n.lineno).value
    told = any(w in ast.unparse(a).lower() for a in [*value.args, *value.keywords]
               for w in ("device", "cuda", "rank")) if isinstance(value, ast.Call) else True
    return isinstance(value, ast.Call) and last(dotted(value))[:1].isupper() and not told


def _moved_after(ctx: Context, name: str, line: int, scope: ast.AST) -> bool:
    """A move of `name` later in `scope` itself (not in a function defined there: its
    `model` is another variable)."""
    return any(_moves(n) and isinstance(n.func, ast.Attribute) and dotted(n.func.value) == name
               and n.lineno > line and ctx.function_of(n) is scope for n in subtree(scope))


def _hard_coded_device(ctx: Context):
    """`cuda:N` literals, and `.cuda()` with no device chosen per rank — not in a model
    driven through RPC (each side places its own tensors) or a one-process test, not
    where each process sees only its own GPU (`CUDA_VISIBLE_DEVICES` set per rank in
    the program: `cuda:0` is the rank's own), nor on the single-process side of a branch
    (`single_process_branch`)."""
    if not distributed(ctx) or uses_rpc(ctx) or holds(ctx, "own_gpu"):
        return
    for node in ctx.nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith("cuda:") and node.value[5:].isdigit() and \
                single_process_branch(ctx, node) is None:
            yield node, f"(`{node.value}`)"
    has_set_device = holds(ctx, "set_device")
    for call in ctx.calls_named("cuda"):
        if isinstance(call.func, ast.Attribute) and not call.args and not has_set_device \
                and dotted(call.func.value) != "torch" and single_process_branch(ctx, call) is None:
            yield call, "(`.cuda()` without torch.cuda.set_device: every rank uses GPU 0)"


def _missing_set_device(ctx: Context):
    """init_process_group where neither this file nor a linted file connected to it by
    imports chooses the rank's GPU (`set_device` under any alias, `set_device_index`,
    `with torch.cuda.device(...)`, a per-rank CUDA_VISIBLE_DEVICES) — not for an init
    that creates no NCCL communicator (`setup.builds_nccl`: gloo, XLA, a fake group)
    unless the file relies on the current device (`setup.current_device_used`), nor
    after a call that may choose the GPU out of sight (`setup.device_picked_before`)."""
    if not (distributed(ctx) and ctx.uses_cuda) or holds(ctx, "set_device"):
        return
    implicit = current_device_used(ctx)
    for call in ctx.calls_named("init_process_group"):
        if (implicit or builds_nccl(ctx, call)) and not device_picked_before(ctx, call):
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
    """A loop that moves some of the batch's tensors to the device but not the others,
    where an unmoved one (or a value computed from unmoved ones only) meets a moved one
    (or a value computed from one) in arithmetic, a comparison, a loss or criterion, or
    torch.cat/stack — not where it is only passed to the model alongside moved ones (the
    model may ignore or place it), nor in a model driven through RPC (its inputs stay
    on the CPU by design)."""
    if uses_rpc(ctx):
        return
    for loop in (n for n in ctx.of(ast.For)):
        names = _batch_names(loop)
        if len(names) < 2:
            continue
        body = [n for stmt in loop.body for n in walk(stmt)]
        moved = _moved_names(body) & set(names)
        if not moved:
            continue
        device, host = _placed(body, _moved_names(body), set(names) - moved)
        reported: set[str] = set()
        for node in sorted((n for n in body if isinstance(n, (ast.BinOp, ast.Compare,
                                                              ast.Call))), key=_position):
            for use in _mixed(node, device, host):
                if host[use.id] not in reported:
                    reported.add(host[use.id])
                    yield use, (f"(`{', '.join(sorted(moved))}` moved to the device, "
                                f"`{host[use.id]}` not)")


def _position(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _placed(body: list[ast.AST], moved: set[str], unmoved: set[str]
            ) -> tuple[set[str], dict[str, str]]:
    """(names holding a value on the device: moved, or computed from a moved value;
    names holding one on the host → the unmoved batch name it was computed from)."""
    device, host = set(moved), {name: name for name in unmoved}
    assigns = sorted((n for n in body if isinstance(n, ast.Assign)), key=_position)
    pairs = [pair for n in assigns for t in n.targets for pair in _pairs(t, n.value)]
    for _ in range(2):  # `out = model(x)` then `logits = out.float()`
        for target, value in pairs:
            side = _side(value, device, host)
            if side == "device":
                device.add(target)
            elif side in unmoved and target not in device:
                host[target] = side
    return device, host


def _pairs(target: ast.expr, value: ast.expr) -> list[tuple[str, ast.expr]]:
    """(name, the value it is given) of `target = value`: `x, y = x.to(d), y` pairs them
    up; `a, b = f(x)` gives each name the whole value."""
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and \
            len(target.elts) == len(value.elts):
        return [p for t, v in zip(target.elts, value.elts) for p in _pairs(t, v)]
    targets = target.elts if isinstance(target, ast.Tuple) else [target]
    return [(dotted(t), value) for t in targets if dotted(t)]


def _side(expr: ast.AST, device: set[str], host: dict[str, str]) -> str:
    """"device" when `expr` uses a device value (or moves one), the unmoved batch name
    it is computed from when it uses only host values, else ""."""
    origin = ""
    for node in walk(expr):
        if _moves(node) or dotted(node) in device and isinstance(node, (ast.Name,
                                                                        ast.Attribute)):
            return "device"
        if isinstance(node, ast.Name) and node.id in host and not _shape_only(node, expr):
            origin = origin or host[node.id]
    return origin


def _shape_only(name: ast.Name, expr: ast.AST) -> bool:
    """`y.shape`, `y.size(0)`, `len(y)`: the tensor's size, not its values."""
    for parent in walk(expr):
        if isinstance(parent, ast.Attribute) and parent.value is name:
            return parent.attr in SHAPE_ATTRS
        if isinstance(parent, ast.Call) and name in parent.args:
            return dotted(parent) == "len"
    return False


def _mixed(node: ast.AST, device: set[str], host: dict[str, str]) -> list[ast.Name]:
    """The host values that `node` — arithmetic, a comparison, a loss, torch.cat/stack —
    puts together with a device value (their first batch name each)."""
    operands = _operands(node)
    sides = [_side(o, device, host) for o in operands]
    if "device" not in sides:
        return []
    return [next(n for n in walk(o) if isinstance(n, ast.Name) and n.id in host)
            for o, side in zip(operands, sides) if side not in ("", "device")]


def _operands(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators]
    if not isinstance(node, ast.Call):
        return []
    name = last(dotted(node)).lower()
    if name in JOINS and node.args and isinstance(node.args[0], (ast.List, ast.Tuple)):
        return list(node.args[0].elts)
    if any(word in name for word in LOSS_WORDS):
        return [*node.args, *(k.value for k in node.keywords)]
    return []


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
    if not any(_moves(n) for n in walk(value)):
        return set()
    while isinstance(target, ast.Subscript):  # batch[k] = batch[k].to(d)
        target = target.value
    return {dotted(e) for e in (target.elts if isinstance(target, ast.Tuple) else [target])}


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
