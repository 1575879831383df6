"""Process-group setup and teardown, DDP options, BatchNorm, rank-0 metrics."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, is_true, keyword


def _hard_coded_master(ctx: Context):
    for node in ctx.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
                        and target.slice.value in ("MASTER_PORT", "MASTER_ADDR"):
                    yield node, f"(`{target.slice.value}` = {node.value.value!r})"


def _no_destroy(ctx: Context):
    if ctx.mentions("destroy_process_group"):
        return
    for call in ctx.calls_named("init_process_group"):
        yield call, ""


def _find_unused(ctx: Context):
    for call in ctx.calls_named("DistributedDataParallel", "DDP"):
        if is_true(keyword(call, "find_unused_parameters")):
            yield call, ""


def _batchnorm_without_sync(ctx: Context):
    if not ctx.mentions("DistributedDataParallel", "DDP") or \
            ctx.mentions("convert_sync_batchnorm", "SyncBatchNorm"):
        return
    for call in ctx.calls_named("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"):
        yield call, ""


RULES = [
    Rule("PX701", "warning", "A hard-coded MASTER_PORT/MASTER_ADDR: two jobs on one machine "
         "collide, and multi-node needs the real address.",
         "Let the launcher set them (torchrun, SLURM, `phalanx train`).",
         "os.environ['MASTER_PORT'] = '12355'  # <-",
         "os.environ.setdefault('MASTER_PORT', str(free_port()))", _hard_coded_master),
    Rule("PX702", "warning", "init_process_group without destroy_process_group: exit can hang "
         "or print warnings.", "Call `dist.destroy_process_group()` at the end (try/finally).",
         "dist.init_process_group('gloo')  # <-\ntrain()",
         "dist.init_process_group('gloo')\ntry:\n    train()\nfinally:\n"
         "    dist.destroy_process_group()", _no_destroy),
    Rule("PX703", "info", "find_unused_parameters=True: a graph traversal every step.",
         "Leave it off unless DDP says parameters received no gradient.",
         "model = DDP(net, find_unused_parameters=True)  # <-",
         "model = DDP(net)", _find_unused),
    Rule("PX704", "warning", "BatchNorm in a DDP model without SyncBatchNorm: each rank "
         "normalises over its own small batch.",
         "`model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` before DDP (GPU only).",
         "net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))  # <-\nmodel = DDP(net)",
         "net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"
         "model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(net))", _batchnorm_without_sync),
]
