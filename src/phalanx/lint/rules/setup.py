"""Process-group setup and teardown, DDP options, BatchNorm, rank-0 metrics."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, is_true, keyword, last
from phalanx.lint.facts import distributed, holds, single_process
from phalanx.lint.rules.collectives import COLLECTIVES, collective_functions

# DistributedDataParallel's keywords, torch 2.6 to 2.13.
DDP_KEYWORDS = {"module", "device_ids", "output_device", "dim", "broadcast_buffers", "init_sync",
                "process_group", "bucket_cap_mb", "find_unused_parameters", "check_reduction",
                "gradient_as_bucket_view", "static_graph", "delay_all_reduce_named_params",
                "param_to_hook_all_reduce", "mixed_precision", "device_mesh",
                "skip_all_reduce_unused_params", "bucket_cap_mb_list", "batched_grad_copy",
                "forward_sync_buffers"}
LOGGERS = {"print", "log", "info", "add_scalar", "add_scalars", "log_metrics", "log_dict",
           "set_postfix", "write"}
METRIC_WORDS = ("loss", "acc", "ppl", "perplexity")
LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def _hard_coded_master(ctx: Context):
    """A constant MASTER_PORT, or a constant MASTER_ADDR other than the loopback address
    (the right one for a job on one machine: only the port can collide there)."""
    for node in ctx.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
                        and target.slice.value in ("MASTER_PORT", "MASTER_ADDR") and not (
                        target.slice.value == "MASTER_ADDR" and node.value.value in LOOPBACK):
                    yield node, f"(`{target.slice.value}` = {node.value.value!r})"


def _no_destroy(ctx: Context):
    """init_process_group where neither this file nor a linted file connected to it by
    imports destroys the group (called, or registered: `atexit.register(dist.destroy_
    process_group)`); not for a fake one-process group of a test."""
    if holds(ctx, "destroy") or single_process(ctx):
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


def _unknown_ddp_keyword(ctx: Context):
    for call in ctx.calls_named("DistributedDataParallel", "DDP"):
        for kw in call.keywords:
            if kw.arg is not None and kw.arg not in DDP_KEYWORDS:
                hint = (" The collective timeout is `init_process_group(timeout=...)`."
                        if kw.arg == "timeout" else "")
                yield call, f"(`{kw.arg}=`: TypeError at construction.{hint})"


def _reduces(ctx: Context, scope: ast.AST, helpers: dict[str, str]) -> bool:
    """Whether `scope` runs (or calls a helper that runs) a reduction/gather, or calls
    something named like one (`reduce_mean`, `gather_metrics`, `sync_loss`)."""
    for node in ast.walk(scope):
        if isinstance(node, ast.Call):
            name = last(dotted(node))
            if name in COLLECTIVES or name in helpers or \
                    any(w in name.lower() for w in ("reduce", "gather", "sync", "mean_across")):
                return True
    return False


def _rank0_metrics(ctx: Context):
    if not distributed(ctx):
        return
    helpers = collective_functions(ctx)
    for call in ctx.calls_named(*LOGGERS):
        cond = ctx.rank_condition(call)
        metric = next((n.id for arg in [*call.args, *(k.value for k in call.keywords)]
                       for n in ast.walk(arg) if isinstance(n, ast.Name)
                       and any(w in n.id.lower() for w in METRIC_WORDS)), None)
        if cond is None or metric is None or _reduces(ctx, ctx.function_of(call), helpers):
            continue
        yield call, (f"(`{metric}` under `if {ast.unparse(cond.test)}:` is rank 0's own "
                     f"value, from 1/world_size of the batch)")


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
    Rule("PX705", "info", "A metric logged on rank 0 without any reduction: it describes rank "
         "0's shard only.", "All-reduce (average) it on every rank first, then log on rank 0.",
         "dist.init_process_group('gloo')\nloss = loss_fn(model(x), y)\nif rank == 0:\n"
         "    print(f'loss {loss.item():.3f}')  # <-",
         "dist.init_process_group('gloo')\nloss = loss_fn(model(x), y)\n"
         "avg = loss.detach().clone()\ndist.all_reduce(avg, op=dist.ReduceOp.AVG)\n"
         "if rank == 0:\n    print(f'loss {avg.item():.3f}')", _rank0_metrics),
    Rule("PX706", "error", "An argument DistributedDataParallel does not take.",
         "Remove it; see the DDP signature (torch.nn.parallel.DistributedDataParallel).",
         "model = DDP(net, device_ids=[rank], timeout=timedelta(minutes=30))  # <-",
         "dist.init_process_group('nccl', timeout=timedelta(minutes=30))\n"
         "model = DDP(net, device_ids=[rank])", _unknown_ddp_keyword),
]
