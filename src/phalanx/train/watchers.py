"""Warnings about a run that still trains: a loss spike, and a rank that is persistently
slower than the others (a straggler). Both are said once per episode on rank 0 and
recorded in the run's events (phalanx.report.events).

- Spikes (`--spike-factor K`, 0: off): a step's global mean loss above K × the median of
  the last 50 logged step losses (judged once 10 are known) is a spike.
- Stragglers (`--straggler-every N`, 0: off): each rank times its data loading and
  forward pass — under DDP neither waits for another rank, so a slow rank's own time
  shows there (under FSDP/ZeRO-3 the forward's all-gathers wait for the slowest, which
  hides it). Every N steps the ranks share their mean (one small all-reduce); a rank
  above 1.5 × the median of the other ranks' at two checks in a row is named with its
  host. On CUDA the time is read after a synchronize, on the last 10 steps of each window
  only.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections import deque

import torch

SPIKE_WINDOW, SPIKE_MIN_HISTORY = 50, 10
STRAGGLER_FACTOR, STRAGGLER_CHECKS, TIMED_STEPS = 1.5, 2, 10


class SpikeWatch:
    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.history: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self.in_spike = False

    def check(self, step: int, loss: float) -> str | None:
        """The warning for `loss` at `step`, when it starts a spike."""
        if self.factor > 0 and len(self.history) >= SPIKE_MIN_HISTORY:
            median = statistics.median(self.history)
            if median > 0 and loss > self.factor * median:
                started, self.in_spike = not self.in_spike, True
                if started:
                    return (f"step {step}: loss {loss:.4f} is {loss / median:.1f}× the median "
                            f"of the last {len(self.history)} steps ({median:.4f}), over "
                            f"--spike-factor {self.factor:g}: a loss spike. If it recurs, "
                            f"lower --lr, lengthen --warmup-steps or clip harder (--grad-clip).")
                return None
        self.in_spike = False
        self.history.append(loss)
        return None


class StragglerWatch:
    def __init__(self, run, every: int) -> None:
        self.run, self.every = run, every
        self.seconds = 0.0  # time in the window
        self.steps: set[int] = set()  # the steps timed
        self.slow_checks = [0] * run.world_size  # checks in a row each rank was slow
        self.named: set[int] = set()

    @contextlib.contextmanager
    def timing(self, step: int):
        """Time data loading + forward of a micro-step of `step` (in the last TIMED_STEPS
        steps of each window)."""
        timed = self.every > 0 and self.run.world_size > 1 and \
            (step % self.every) >= self.every - TIMED_STEPS
        if not timed:
            yield
            return
        t0 = time.perf_counter()
        yield
        if self.run.device.type == "cuda":
            torch.cuda.synchronize(self.run.device)
        self.seconds += time.perf_counter() - t0
        self.steps.add(step)

    def check(self, step: int) -> str | None:
        """Every `every` steps (a collective on every rank): the warning naming a rank that
        has been slow at STRAGGLER_CHECKS checks in a row (once per episode)."""
        if self.every <= 0 or self.run.world_size < 2 or step % self.every or not self.steps:
            return None
        import torch.distributed as dist

        run = self.run
        mine = torch.zeros(run.world_size, dtype=torch.float64, device=run.device)
        mine[run.rank] = self.seconds / len(self.steps)
        dist.all_reduce(mine)
        self.seconds, self.steps = 0.0, set()
        times = mine.tolist()
        warnings = []
        for rank, seconds in enumerate(times):
            others = statistics.median(times[:rank] + times[rank + 1:])
            slow = others > 0 and seconds > STRAGGLER_FACTOR * others
            self.slow_checks[rank] = self.slow_checks[rank] + 1 if slow else 0
            if not slow:
                self.named.discard(rank)
            elif self.slow_checks[rank] >= STRAGGLER_CHECKS and rank not in self.named:
                self.named.add(rank)
                host = run.topology.peers.host(rank) if run.topology.peers else "?"
                warnings.append(
                    f"step {step}: rank {rank} on {host} is a straggler: data + forward take "
                    f"{seconds * 1e3:.1f} ms per step there, {seconds / others:.1f}× the "
                    f"median of the other ranks ({others * 1e3:.1f} ms), at "
                    f"{self.slow_checks[rank]} checks in a row. Every rank waits for it; check "
                    f"its data loading, threads (--threads-per-rank) and other jobs on its "
                    f"cores/GPU (`phalanx doctor`).")
        return " ".join(warnings) or None
