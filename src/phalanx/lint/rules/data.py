"""Data sharding: samplers, shuffling, set_epoch, downloads."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, is_true, keyword, last

SHARDERS = {"setup_dataloaders", "prepare", "prepare_data_loader"}  # Fabric, Accelerate


def _sharded_by_framework(ctx: Context, call: ast.Call) -> bool:
    """The loader goes through Fabric's `setup_dataloaders` or Accelerate's `prepare`,
    which add the distributed sampler: directly, or by the name it is assigned to."""
    parent = ctx.parents.get(call)
    if isinstance(parent, ast.Call) and last(dotted(parent)) in SHARDERS:
        return True
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        name = dotted(parent.targets[0])
        return any(dotted(a) == name for c in ctx.calls_named(*SHARDERS) for a in c.args)
    return False


def _loader_without_sampler(ctx: Context):
    if not ctx.distributed:
        return
    for call in ctx.calls_named("DataLoader"):
        if keyword(call, "sampler") is None and keyword(call, "batch_sampler") is None \
                and len(call.args) < 4 and ctx.rank_condition(call) is None \
                and not _sharded_by_framework(ctx, call):
            yield call, ""


def _sampler_and_shuffle(ctx: Context):
    for call in ctx.calls_named("DataLoader"):
        if keyword(call, "sampler") is not None and is_true(keyword(call, "shuffle")):
            yield call, ""


def _set_epoch_never_called(ctx: Context):
    if ctx.mentions("set_epoch"):
        return
    for call in ctx.calls_named("DistributedSampler"):
        if keyword(call, "shuffle") is None or is_true(keyword(call, "shuffle")):
            yield call, ""


def _download_on_every_rank(ctx: Context):
    if not ctx.distributed:
        return
    for call in ctx.calls:
        if is_true(keyword(call, "download")) and ctx.rank_condition(call) is None:
            yield call, ""


RULES = [
    Rule("PX201", "warning", "A DataLoader in a distributed script without a distributed "
         "sampler: every rank reads the whole dataset.",
         "Pass `sampler=DistributedSampler(ds)` (or use `run.loader`).",
         "dist.init_process_group('gloo')\nloader = DataLoader(ds, batch_size=8)  # <-",
         "dist.init_process_group('gloo')\n"
         "loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))",
         _loader_without_sampler),
    Rule("PX202", "error", "`sampler=` and `shuffle=True` together: DataLoader raises "
         "(the sampler decides the order).", "Drop `shuffle=True`; the sampler shuffles.",
         "loader = DataLoader(ds, sampler=sampler, shuffle=True)  # <-",
         "loader = DataLoader(ds, sampler=sampler)", _sampler_and_shuffle),
    Rule("PX203", "warning", "DistributedSampler without set_epoch: every epoch sees the same "
         "order.", "Call `sampler.set_epoch(epoch)` at the start of every epoch.",
         "sampler = DistributedSampler(ds)  # <-\nfor epoch in range(3):\n"
         "    for batch in DataLoader(ds, sampler=sampler):\n        step(batch)",
         "sampler = DistributedSampler(ds)\nfor epoch in range(3):\n"
         "    sampler.set_epoch(epoch)\n    for batch in DataLoader(ds, sampler=sampler):\n"
         "        step(batch)", _set_epoch_never_called),
    Rule("PX204", "warning", "A dataset downloaded by every rank at once: they race on the "
         "same files.", "Download on rank 0 (or local rank 0), barrier, then load everywhere.",
         "dist.init_process_group('gloo')\nds = MNIST('data', download=True)  # <-",
         "dist.init_process_group('gloo')\nif rank == 0:\n    MNIST('data', download=True)\n"
         "dist.barrier()\nds = MNIST('data')", _download_on_every_rank),
]
