"""Each rank's pace, and the straggler it reveals.

In synchronous data parallelism every rank's step takes the same wall time: a slow rank
makes the others wait for it in the next collective. What differs is how the time is
spent, so a rank's *own time* per optimizer step is its step's wall time (from one
`run.step` to the next) minus the time it waited in collectives — and the straggler is
the rank whose own time is longest (it waits least). Where the slowness lies does not
matter: data loading, the forward, the optimizer, or anything between two steps.

The waits timed (`waiting()`, nestable) are Phalanx's: `acc.backward` (the gradient
sync), the clip (a sharded norm's all-reduce), `run`'s collectives (`all_reduce`,
`agree`, `barrier`, ...), the trainer's NaN flags, and those each strategy marks
(`Strategy.time_waits`: DDP's buffer broadcast in the forward, FSDP's all-gathers before
each sharded module's forward, ZeRO's parameter broadcast after the step). A script that
calls `loss.backward()` itself rather than `acc.backward(loss)` leaves its gradient sync
untimed: a slow rank then goes unnamed there (it makes no false alarm).

Every `every` optimizer steps the ranks share the median of their own times over those
steps (one all-reduce of `world_size` numbers). A rank over `FACTOR` × the median of
the other ranks', by at least `MIN_GAP_S`, at `CHECKS` checks in a row, is named once
per episode with its host, its ratio to the fastest rank and to its own best window.
On CUDA the boundaries are CUDA events recorded on the current stream (host time would
measure the queueing of kernels, not their running): nothing synchronizes until the
check, which reads them after one `synchronize`.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from phalanx.paths import RunDir

FACTOR, CHECKS, MIN_GAP_S = 2.0, 2, 0.020
Stamp = Any  # a moment: perf_counter's seconds on CPU, a recorded torch.cuda.Event on CUDA


@dataclass
class Scores:
    """One check's figures: each rank's median own time per step (seconds), the slowest
    rank, and its ratios to the fastest rank and to its own best window."""

    step: int
    seconds: list[float]
    slowest: int
    to_fastest: float
    to_own_best: float

    def metrics(self) -> dict[str, float]:
        return {"slowest_rank": float(self.slowest), "slowest_to_fastest": self.to_fastest,
                "slowest_to_own_best": self.to_own_best}


@dataclass
class Pace:
    """Times one rank's steps and waits; `check` shares and judges them (a collective)."""

    world_size: int
    rank: int
    device: torch.device
    every: int  # optimizer steps per check (0: off)
    host_of: Callable[[int], str] = lambda rank: "?"
    waits: list[tuple[Stamp, Stamp]] = field(default_factory=list)  # the current step's
    steps: list[tuple[Stamp, Stamp, list]] = field(default_factory=list)  # since the check
    last: Stamp | None = None  # when the previous step ended
    latest: Scores | None = None  # the last check's
    events_dir: RunDir | Path | None = None  # where a warning is recorded (default: `run.out`)
    _depth: int = 0
    _entered: Stamp = None
    _slow_checks: list[int] = field(default_factory=list)
    _best: list[float] = field(default_factory=list)
    _named: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._slow_checks = [0] * self.world_size
        self._best = [math.inf] * self.world_size

    @property
    def on(self) -> bool:
        return self.every > 0 and self.world_size > 1

    def _stamp(self) -> Stamp:
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def _seconds(start: Stamp, end: Stamp) -> float:
        if isinstance(start, float):
            return end - start
        return start.elapsed_time(end) / 1e3  # (CUDA events: milliseconds)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A block spent (at least partly) waiting for the other ranks."""
        if not self.on:
            yield
            return
        if self._depth == 0:
            self._entered = self._stamp()
        self._depth += 1
        try:
            yield
        finally:
            if self._depth > 0:  # (0: `stepped` ended a wait an exception left open)
                self._depth -= 1
                if self._depth == 0:
                    self.waits.append((self._entered, self._stamp()))

    def stepped(self) -> None:
        """An optimizer step ended: its own time joins the window."""
        if not self.on:
            return
        now = self._stamp()
        self._depth = 0  # (a wait an exception left open, e.g. in a forward hook, ends)
        if self.last is not None:
            self.steps.append((self.last, now, self.waits))
        self.last, self.waits = now, []

    def own_times(self) -> list[float]:
        """Each step's own seconds since the last check (CUDA: after a synchronize)."""
        if self.device.type == "cuda" and self.steps:
            torch.cuda.synchronize(self.device)
        span = self._seconds
        return [max(0.0, span(start, end) - sum(span(a, b) for a, b in waits))
                for start, end, waits in self.steps]

    def check(self, step: int) -> str | None:
        """At every `every`-th step (on every rank: one all-reduce), the warning naming
        a rank that has become a straggler, once per episode; None otherwise."""
        if not self.on or step % self.every or not self.steps:
            return None
        import torch.distributed as dist

        shared = torch.zeros(self.world_size, dtype=torch.float64, device=self.device)
        shared[self.rank] = statistics.median(self.own_times())
        self.steps = []
        with self.waiting():
            dist.all_reduce(shared)
        return self.judge(step, shared.tolist())

    def judge(self, step: int, seconds: list[float]) -> str | None:
        """Score the ranks' own times of one window; the warning for a rank slow at
        `CHECKS` checks in a row (said once until it is no longer slow)."""
        fastest = min(seconds)
        self._best = [min(b, s) for b, s in zip(self._best, seconds)]
        slowest = max(range(len(seconds)), key=seconds.__getitem__)
        self.latest = Scores(step, seconds, slowest, _ratio(seconds[slowest], fastest),
                             _ratio(seconds[slowest], self._best[slowest]))
        said, ordered = [], sorted(range(len(seconds)), key=seconds.__getitem__)
        place = {rank: i for i, rank in enumerate(ordered)}
        for rank, own in enumerate(seconds):
            others = _median_without([seconds[r] for r in ordered], place[rank])
            slow = own > FACTOR * others and own - others >= MIN_GAP_S
            self._slow_checks[rank] = self._slow_checks[rank] + 1 if slow else 0
            if not slow:
                self._named.discard(rank)
            elif self._slow_checks[rank] >= CHECKS and rank not in self._named:
                self._named.add(rank)
                said.append(self._warning(step, rank, own, others, fastest))
        return " ".join(said) or None

    def _warning(self, step: int, rank: int, own: float, others: float,
                 fastest: float) -> str:
        return (f"step {step}: rank {rank} on {self.host_of(rank)} is a straggler: its own "
                f"time (the step minus its waits in collectives) is {own * 1e3:.1f} ms per "
                f"step, {own / others:.1f}× the median of the other ranks "
                f"({others * 1e3:.1f} ms; {_ratio(own, fastest):.1f}× the fastest, "
                f"{_ratio(own, self._best[rank]):.1f}× its own best), at "
                f"{self._slow_checks[rank]} checks of {self.every} steps in a row. Every "
                f"rank waits for it; check its data loading, threads (--threads-per-rank) "
                f"and other jobs on its cores/GPU (`phalanx doctor`).")


def _median_without(ordered: list[float], i: int) -> float:
    """The median of sorted `ordered` without its element `i` (O(1): thousands of ranks
    are judged every few steps)."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < i else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def _ratio(value: float, base: float) -> float:
    return value / base if base > 0 else 1.0
