"""`phalanx bench --scaling`: 1 … N ranks inside one launch, the sizes interleaved.

Separate launches per size drift apart on a shared machine (the same 2-rank step
measured 277 and 297 ms/step in two launches a minute apart). Here every size runs in
the same launch: for n ranks, ranks 0 … n-1 train (one rank alone: no DDP, as a
1-process run; otherwise DDP on a group of those ranks) while the others wait, idle, in
the block's closing all-reduce. Blocks of every size alternate round by round, so each
efficiency is a ratio paired by round, with a bootstrap 95% interval.

Weak: fixed per-rank batch, efficiency = t(1) / t(n). Strong: fixed global batch
(micro-batch × N), efficiency = t(1) / (n · t(n)). Same threads per rank at every size.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch.distributed as dist

from phalanx.bench import stats
from phalanx.bench.peers import phalanx
from phalanx.bench.runner import compare
from phalanx.strategies.single import SingleStrategy


def sizes(cfg, world: int) -> list[tuple[str, int, int]]:
    """(kind, ranks, per-rank micro-batch) for every point of both sweeps."""
    micro = cfg.train.micro_batch_size
    points = [("weak", n, micro) for n in range(1, world + 1)]
    points += [("strong", n, micro * world // n) for n in range(1, world + 1)
               if micro * world % n == 0]  # the global batch must split evenly
    return points


def _step(cfg, tokens, run, n: int, per_rank: int, group):
    conf = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train,
                                                              micro_batch_size=per_rank))
    if n == 1:
        return phalanx(conf, tokens, run, strategy=SingleStrategy(run.topology))
    return phalanx(conf, tokens, run, ddp={"process_group": group} if group else {})


def sweep(cfg, tokens, run, repeats: int, n_steps: int, warmup: int) -> dict:
    world = run.world_size
    groups = {n: dist.new_group(list(range(n))) for n in range(2, world)}  # every rank calls
    points = sizes(cfg, world)
    steps = {f"{kind}-{n}": _step(cfg, tokens, run, n, per_rank, groups.get(n))
             if run.rank < n else None for kind, n, per_rank in points}
    times = compare(run, steps, repeats, n_steps, warmup)
    found: dict[str, list] = {"weak": [], "strong": []}
    for kind, n, per_rank in points:
        mine, alone = times[f"{kind}-{n}"], times[f"{kind}-1"]
        tokens_per_step = per_rank * n * cfg.train.grad_accum * cfg.model.block_size
        mid, low, high = stats.ratio_interval(alone, mine)
        scale = 1 if kind == "weak" else n
        found[kind].append({
            "ranks": n, "global_batch": per_rank * n * cfg.train.grad_accum,
            "ms": statistics.median(mine) * 1e3,
            "tokens_per_s": tokens_per_step / statistics.median(mine),
            "efficiency": [mid / scale, low / scale, high / scale], "times": mine})
    return found
