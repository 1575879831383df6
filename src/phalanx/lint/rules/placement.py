"""Where models and tensors live: DataParallel, wrap order, hard-coded GPUs."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, last


def _data_parallel(ctx: Context):
    for call in ctx.calls_named("DataParallel"):
        yield call, ""


def _moves(node: ast.AST) -> bool:
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
    if not ctx.uses_cuda:
        return
    for call in ctx.calls_named("DistributedDataParallel", "DDP"):
        if not call.args:
            continue
        arg = call.args[0]
        if isinstance(arg, ast.Call) and last(dotted(arg)) in ("to", "cuda"):
            continue
        name = dotted(arg)
        if name and not _moved_before(ctx, name, call.lineno, ctx.function_of(call)):
            yield call, f"(`{name}` is not moved to a device before)"


def _hard_coded_device(ctx: Context):
    if not ctx.distributed:
        return
    for node in ctx.nodes:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith("cuda:") and node.value[5:].isdigit():
            yield node, f"(`{node.value}`)"
    has_set_device = ctx.mentions("set_device")
    for call in ctx.calls_named("cuda"):
        if isinstance(call.func, ast.Attribute) and not call.args and not has_set_device \
                and dotted(call.func.value) != "torch":
            yield call, "(`.cuda()` without torch.cuda.set_device: every rank uses GPU 0)"


def _missing_set_device(ctx: Context):
    if not (ctx.distributed and ctx.uses_cuda) or ctx.mentions("set_device"):
        return
    for call in ctx.calls_named("init_process_group"):
        yield call, ""


RULES = [
    Rule("PX101", "error", "nn.DataParallel: single-process, slower than DDP and not "
         "multi-node.", "Use DistributedDataParallel with one process per GPU (torchrun).",
         "model = nn.DataParallel(model)  # <-",
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
]
