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
import json
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
# collective operations as torch's profiler names them: the c10d calls, and the backend's
# own work (gloo's runs on its threads); FSDP's `FSDP::…` hooks and copies are not
COLLECTIVE_MARKS = ("c10d::", "nccl:", "gloo:")


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
        self._mark, self._from = 0.0, 0
        self._walls: list[float] = []
        self._start_if_due(done)

    def _start_if_due(self, done: int) -> None:
        if self._prof is None and not self._walls and self.first <= done + 1 <= self.end:
            activities = [ProfilerActivity.CPU]
            if self.run.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._prof = profile(activities=activities)
            self._prof.start()
            self._mark, self._from = time.perf_counter(), done + 1

    def close(self, done: int) -> None:
        """The loop ended (every rank at the same step: a stop, or the last step) inside
        the range: write what was profiled."""
        if self._prof is not None:
            self.end = done
            self.after(done, timed=False)

    def abandon(self) -> None:
        """An exception left the loop: stop recording, write nothing (no collective)."""
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.stop()

    def after(self, done: int, timed: bool = True) -> None:
        if self._prof is not None:
            now = time.perf_counter()
            if timed:
                self._walls.append(now - self._mark)
            self._mark = now
            if done >= self.end:
                prof, self._prof = self._prof, None
                prof.stop()
                write(self.run, prof, self._walls, self.out, (self._from, done))
        self._start_if_due(done)


def write(run: Any, prof: Any, walls: list[float], out: Path, steps: tuple[int, int]) -> Path:
    """This rank's trace and figures; rank 0 gathers every rank's into summary.json (a
    collective: every rank calls it). A rank that cannot write is said on every rank."""
    where = Path(out)
    try:
        ensure_dir(where, "where the profile goes")
        with tempfile.TemporaryDirectory(dir=where) as tmp:  # the profiler writes by name
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            atomic_write(where / f"rank-{run.rank}.json.gz", gzip.compress(trace.read_bytes()))
        found: Any = figures(prof, walls)
    except (OSError, UserError) as exc:
        found = f"rank {run.rank} could not write its profile to `{where}`: {exc}"
    everyone = run.gather_objects(found)
    failed = [f for f in everyone if isinstance(f, str)]
    if not failed and run.is_main:
        try:
            atomic_write(where / "summary.json", json.dumps(
                {"steps": list(steps), "ranks": everyone}, indent=1) + "\n")
        except OSError as exc:
            failed = [f"rank 0 could not write `{where / 'summary.json'}`: {exc}"]
    failed = run.broadcast(failed)
    if failed:
        raise UserError(failed[0])
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
        elif e.key.startswith(COLLECTIVE_MARKS):
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
