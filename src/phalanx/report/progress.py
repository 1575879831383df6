"""Rank-0 progress: a live bar on a terminal, plain periodic lines elsewhere (CI, logs)."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


def _say(text: str) -> None:
    """One console line as one write: `print` writes the text and its newline apart, and
    a line another thread prints between them (the stop-signal watcher's, on one rank in
    the launcher's own process) would join this one."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _fmt_time(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s:02d}s"


class ProgressReporter:
    """Shows step, loss, tokens/s and ETA. Only create it on rank 0."""

    def __init__(self, total_steps: int, start_step: int = 0, live: bool | None = None) -> None:
        self.total, self.start = total_steps, start_step
        self.live = sys.stdout.isatty() if live is None else live
        self.t0 = time.perf_counter()
        self._progress: Progress | None = None
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"), TimeRemainingColumn(),
                console=Console(), transient=False)
            self._task = self._progress.add_task("train", total=total_steps,
                                                 completed=start_step, status="")
            self._progress.start()

    def update(self, step: int, loss: float, tokens_per_s: float, lr: float) -> None:
        status = f"loss {loss:.4f} | {tokens_per_s:,.0f} tok/s | lr {lr:.2e}"
        if self._progress is not None:
            self._progress.update(self._task, completed=step, status=status)
            return
        done = step - self.start
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / max(1, done) * (self.total - step)
        _say(f"step {step}/{self.total} | {status} | eta {_fmt_time(eta)}")

    def first_step(self, step: int, seconds: float, log_every: int) -> None:
        """This process's first step is done (the bar moves; elsewhere, one line)."""
        if self._progress is not None:
            self._progress.update(self._task, completed=step, status="first step done")
            return
        _say(f"step {step}/{self.total} | first step done in {seconds:.2f} s | next line at "
             f"step {min(self.total, (step // log_every + 1) * log_every)}")

    def message(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            _say(text)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class PhaseProgress:
    """Rank 0's progress through one phase of a measurement (`phalanx bench`): a bar on a
    terminal; elsewhere a line when the phase starts and one per quarter done."""

    def __init__(self, enabled: bool, label: str, total: int) -> None:
        self.enabled, self.label, self.total, self.done = enabled, label, max(1, total), 0
        self._progress: Progress | None = None
        if not enabled:
            return
        if sys.stdout.isatty():
            self._progress = Progress(TextColumn(f"[bold]{label}"), BarColumn(),
                                      MofNCompleteColumn(), TimeRemainingColumn(),
                                      console=Console(), transient=False)
            self._task = self._progress.add_task(label, total=self.total)
            self._progress.start()
        else:
            _say(f"bench: {label} (0/{self.total})")

    def advance(self) -> None:
        self.done += 1
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done)
        elif self.enabled and self.done * 4 // self.total > (self.done - 1) * 4 // self.total:
            _say(f"bench: {self.label} ({self.done}/{self.total})")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
