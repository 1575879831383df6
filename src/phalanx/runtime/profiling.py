"""A torch profiler over chosen steps, per rank: the trainer's `--profile-steps A-B` and a
script's `run.profile(...)`.

Each rank writes its Chrome/Perfetto trace to `OUT/profile/rank-R.json.gz`; rank 0 writes
`OUT/profile/summary.json` with every rank's figures per profiled step (ms): the labelled
phases of a step (`phalanx::data`, `::forward`, `::backward`, `::optimizer`, recorded by
`runtime.train_step`), the time the main thread spent in collectives (c10d and FSDP's own
ops, inside those phases), the rest of the wall time (logging, evaluation, checkpoints,
waiting), and the top operators by self time. The run report shows it.
"""

from __future__ import annotations

import gzip
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from phalanx.errors import UserError
from phalanx.paths import atomic_write, ensure_dir

PHASES = ("data", "forward", "backward", "optimizer")
TOP = 10  # operators listed per rank
COLLECTIVE_MARKS = ("c10d::", "FSDP::", "nccl:", "gloo:")


class StepProfiler:
    """Profiles optimizer steps `first`..`last` (1-based, as the progress line counts them)
    of one rank. `after(done)` after each step (`done`: the steps done now) marks the step's
    wall time, stops after `last` — or after `end`, the run's last step — and starts before
    the first step due (a run resumed inside the range profiles its remaining steps)."""

    def __init__(self, run: Any, steps: tuple[int, int], out: Path, done: int,
                 end: int) -> None:
        self.run, (self.first, self.last), self.out = run, steps, Path(out)
        self.end = min(end, self.last)
        self._prof: Any = None
        self._mark = 0.0
        self._walls: list[float] = []
        self._start_if_due(done)

    def _start_if_due(self, done: int) -> None:
        if self._prof is None and not self._walls and self.first <= done + 1 <= self.end:
            activities = [ProfilerActivity.CPU]
            if self.run.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._prof = profile(activities=activities)
            self._prof.start()
            self._mark = time.perf_counter()

    def after(self, done: int) -> None:
        if self._prof is not None:
            now = time.perf_counter()
            self._walls.append(now - self._mark)
            self._mark = now
            if done >= self.end:
                prof, self._prof = self._prof, None
                prof.stop()
                write(self.run, prof, self._walls, self.out, (done - len(self._walls) + 1,
                                                              done))
        self._start_if_due(done)


def write(run: Any, prof: Any, walls: list[float], out: Path, steps: tuple[int, int]) -> Path:
    """This rank's trace and figures; rank 0 gathers every rank's into summary.json (a
    collective: every rank calls it)."""
    where = ensure_dir(out, "where the profile goes")
    with tempfile.TemporaryDirectory(dir=where) as tmp:  # the profiler writes by name
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        atomic_write(where / f"rank-{run.rank}.json.gz", gzip.compress(trace.read_bytes()))
    found = figures(prof, walls)
    everyone = run.gather_objects(found)
    if run.is_main:
        import json

        atomic_write(where / "summary.json", json.dumps(
            {"steps": list(steps), "ranks": everyone}, indent=1) + "\n")
    return where


def figures(prof: Any, walls: list[float]) -> dict[str, Any]:
    """ms per profiled step: phases, collectives, the rest of the wall time; top ops."""
    n = max(1, len(walls))
    averages = prof.key_averages()
    phases = {p: 0.0 for p in PHASES}
    collectives, ops = 0.0, []
    for e in averages:
        if e.key.startswith("phalanx::") and e.key.split("::")[1] in phases:
            phases[e.key.split("::")[1]] += e.cpu_time_total / 1e3 / n
        elif e.key.startswith(COLLECTIVE_MARKS) or "all_gather" in e.key \
                or "reduce_scatter" in e.key or "allreduce" in e.key:
            collectives += e.self_cpu_time_total / 1e3 / n
        else:
            ops.append((e.key, e.self_cpu_time_total / 1e3 / n))
    wall = sum(walls) * 1e3 / n
    ops.sort(key=lambda kv: -kv[1])
    return {"wall_ms": wall, "phases_ms": phases, "collectives_ms": collectives,
            "rest_ms": max(0.0, wall - sum(phases.values())),
            "top_ops_ms": [[k, v] for k, v in ops[:TOP]]}


@contextmanager
def profiling(run: Any, out: str | Path | None):
    """`run.profile(out)`: profile the block on this rank, then write the trace and rank
    0's summary (see the module). Yields the torch profiler (`prof.step()` is not needed)."""
    where = Path(out) if out is not None else (Path(run.out) / "profile" if run.out else None)
    if where is None:
        raise UserError("run.profile() needs a directory: give it one (run.profile(DIR)) "
                        "or a run directory to phalanx.init(out=...).")
    prof = profile(activities=[ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() and run.device.type == "cuda"
        else []))
    started = time.perf_counter()
    prof.start()
    try:
        yield prof
    finally:
        prof.stop()
    write(run, prof, [time.perf_counter() - started], where, (0, 0))
