"""The bench worker: time steps side by side in one process group, and profile one.

Timing: after `warmup` steps of each implementation, blocks of `steps` steps alternate
between them (A B C D, then D C B A, ...); a block's time per step is the slowest rank's
(all_reduce MAX). Profile: torch.profiler over a few Phalanx steps with the phases
labelled (data, forward, backward, optimizer); exposed communication is measured by
ablation — the same steps with the gradient all-reduce skipped (no_sync throughout) —
so it is exactly what communication adds to a step.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from phalanx.paths import ensure_dir, replacing
from phalanx.report.progress import PhaseProgress
from phalanx.runtime.train_step import optimizer_step
from phalanx.strategies.base import BackwardSyncControl


def timed(run, step, n: int) -> float:
    """Seconds per step over `n` steps, slowest rank's. A rank whose `step` is None sits
    the block out (idle in the final all-reduce), as `--scaling` does for smaller sizes."""
    _sync(run)
    run.barrier()
    t0 = time.perf_counter()
    took = 0.0
    if step is not None:
        for _ in range(n):
            step()
        _sync(run)
        took = (time.perf_counter() - t0) / n
    return run.agree(took, "max")


class Stopped(Exception):
    """Ctrl-C / SIGTERM during timing: the rounds completed so far (each setup the same
    number of blocks; none when not even one round was)."""

    def __init__(self, times: dict[str, list[float]]) -> None:
        super().__init__("stopped")
        self.times = times


def compare(run, steps: dict, repeats: int, n: int, warmup: int,
            label: str = "timing") -> dict[str, list[float]]:
    """Blocks of `n` steps of each setup, alternating order, after `warmup` steps each
    (rank 0 shows the progress). Raises `Stopped` with the complete rounds on Ctrl-C."""

    times: dict[str, list[float]] = {name: [] for name in steps}
    bar = PhaseProgress(run.is_main, label, len(steps) * (repeats + (1 if warmup else 0)))
    try:
        for step in steps.values():
            if warmup:
                timed(run, step, warmup)
                bar.advance()
        for r in range(repeats):
            order = list(steps) if r % 2 == 0 else list(reversed(steps))
            for name in order:
                times[name].append(timed(run, steps[name], n))
                bar.advance()
    except KeyboardInterrupt:
        rounds = min(len(t) for t in times.values())
        raise Stopped({name: t[:rounds] for name, t in times.items()}) from None
    finally:
        bar.close()
    return times


def _labelled_step(step, sync: bool = True):
    """One Phalanx step with its phases labelled for the profiler."""

    model, acc, opt, batches, precision = (step.model, step.acc, step.opt, step.batches,
                                           step.precision)
    can_skip = isinstance(acc.strategy, BackwardSyncControl)

    def run_step():
        for _ in range(acc.steps):
            with record_function("phalanx::data"):
                x, y = next(batches)
            no_comm = acc.strategy.no_backward_sync(model, enabled=True) \
                if not sync and can_skip else nullcontext()
            with acc.micro_step(), no_comm:  # the trainer's sync rule; or none at all
                with record_function("phalanx::forward"), precision.autocast():
                    _, loss = model(x, y)
                with record_function("phalanx::backward"):
                    acc.backward(loss, precision.scaler)
        optimizer_step(step.run, model, opt, step.grad_clip)  # labelled "phalanx::optimizer"
    return run_step


def breakdown(run, step, out: Path, n: int, repeats: int) -> dict:
    """Per-phase ms/step from the profiler (this rank), a Chrome trace per rank, and the
    exposed communication by ablation (slowest rank, median of `repeats` blocks), with
    what it is made of: the all-reduce on its own, and the wait for the slower rank."""
    synced, unsynced = _labelled_step(step), _labelled_step(step, sync=False)
    for _ in range(2):
        synced()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            synced()
    ensure_dir(out, "where `phalanx bench` writes")
    with replacing(out / f"trace-rank{run.rank}.json") as tmp:  # a link there: replaced
        prof.export_chrome_trace(str(tmp))
    phases = {e.key.split("::")[1]: e.cpu_time_total / 1e3 / n for e in prof.key_averages()
              if e.key.startswith("phalanx::")}
    collectives = {k: v / n for k, v in _collective_ms(prof).items()}
    if step.strategy.sharded:  # its all-gathers cannot be left out: no ablation
        return {"phases_ms": phases, "collectives_ms": collectives}
    times = compare(run, {"synced": synced, "no communication": unsynced}, repeats, n, 1)
    with_comm = statistics.median(times["synced"])
    without = statistics.median(times["no communication"])
    return {"phases_ms": phases, "collectives_ms": collectives, "step_ms": with_comm * 1e3,
            "no_comm_step_ms": without * 1e3,
            "exposed_comm_ms": max(0.0, with_comm - without) * 1e3,
            "exposed_comm_fraction": max(0.0, with_comm - without) / with_comm,
            "allreduce_alone_ms": allreduce_alone(run, step.model) * 1e3,
            "rank_wait_ms": rank_wait(run, unsynced, 3 * n) * 1e3}


def _collective_ms(prof) -> dict[str, float]:
    """Profiler time (ms, all steps) in FSDP's own phases and in c10d collectives, by name:
    where a sharded step's extra time goes (all-gather, reduce-scatter, copies)."""
    found: dict[str, float] = {}
    for e in prof.key_averages():
        if e.key.startswith(("FSDP::", "c10d::")) or "all_gather" in e.key \
                or "reduce_scatter" in e.key or "allreduce" in e.key:
            kind = e.key.split(" (")[0]  # FSDP names each block: sum them by kind
            found[kind] = found.get(kind, 0.0) + e.cpu_time_total / 1e3
    return dict(sorted(found.items(), key=lambda kv: -kv[1])[:8])


def _sync(run) -> None:
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)


def allreduce_alone(run, model, repeats: int = 20) -> float:
    """Seconds for one all-reduce of every gradient (one flat fp32 tensor), ranks lined up
    by a barrier first: the communication's own cost, slowest rank, median."""
    numel = sum(p.numel() for p in model.parameters() if p.requires_grad)
    flat = torch.zeros(numel, dtype=torch.float32, device=run.device)
    took = torch.zeros(repeats, dtype=torch.float64, device=run.device)
    for i in range(-2, repeats):  # two untimed
        run.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(flat)
        _sync(run)
        if i >= 0:
            took[i] = time.perf_counter() - t0
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return took.median().item()


def rank_wait(run, step, n: int) -> float:
    """Seconds per step that synchronising every step would cost even with free
    communication: the mean over steps of (slowest rank's time − the ranks' mean time),
    timed on steps that do not synchronise."""
    took = torch.zeros(n, dtype=torch.float64, device=run.device)
    for i in range(n):
        t0 = time.perf_counter()
        step()
        _sync(run)
        took[i] = time.perf_counter() - t0
    every = [torch.zeros_like(took) for _ in range(run.world_size)]
    dist.all_gather(every, took)
    ranks = torch.stack(every)  # ranks × steps
    return (ranks.max(0).values - ranks.mean(0)).mean().item()
