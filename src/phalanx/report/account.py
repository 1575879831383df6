"""`phalanx run`'s account of a run in its run directory: `OUT/events.jsonl` (the start,
each restart, how it ended, at which step) and `OUT/report.html`, written by the launcher
that holds the directory (or global rank 0 under torchrun / srun).

An attempt that is refused — it ends with a usage error (exit 2: a typo in the script's
arguments, `phalanx.init(strategy="fsd")`) before it advanced the run (no metric logged,
no checkpoint committed) — leaves the run directory as it found it: its start and failure
events, and what its ranks wrote to their logs, are taken back, and the report is not
rewritten (a finished run stays "complete"); `environment.json`, which `phalanx.init`
rewrites, is put back as it was.

An attempt whose launcher was killed without a word (SIGKILL, its machine lost) recorded
its start and nothing after; the next start records that ending first, as a failure at
the step the run had reached, timed when the attempt last wrote to the directory."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from phalanx.checkpoint.rundir import step_of
from phalanx.errors import Interrupted, UserError
from phalanx.paths import RunDir, atomic_write
from phalanx.report.events import LIFECYCLE, read_events, record_event
from phalanx.report.records import check_metric, read_records

# a rank that exits with 128 + one of these stopped at a signal (SIGUSR1: SLURM's warning)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT)


def step_now(out: RunDir, logged: bool = True) -> int:
    """How far the run is: the step of the newest committed checkpoint under
    OUT/checkpoints (where a restart or a resume continues from), or with `logged` the
    last step logged to metrics.jsonl when that is later; 0 when there is neither."""
    from phalanx.checkpoint.store import read_latest  # (imports torch: not at CLI start)

    latest = read_latest(out.checkpoints)
    steps = [r["step"] for r in read_records(out.metrics, check_metric, lambda _: None)
             ] if logged else []
    return max([0, *steps, step_of(latest) if latest is not None else 0])


def restarts_said(out: RunDir, max_restarts: int) -> Callable[[str], None]:
    """For the agent's failures: each one it restarts the ranks after is said in one line
    and recorded as a restart event (the last failure is the job's: not a restart)."""
    failures = 0

    def said(cause: str) -> None:
        nonlocal failures
        failures += 1
        if failures <= max_restarts:
            line = f"restart {failures} of at most {max_restarts} after {cause}"
            print(f"phalanx: {line}", file=sys.stderr, flush=True)
            record_event(out, "restart", step_now(out, logged=False), line)

    return said


def ending(exc: BaseException) -> tuple[str, str]:
    """The event (kind, what happened) of a run that ended with `exc`."""
    code = exc.code if isinstance(exc, SystemExit) else None
    if isinstance(exc, SystemExit) and code in (0, None):
        return "end", "finished"
    signum = exc.signum if isinstance(exc, Interrupted) else (
        signal.SIGINT if isinstance(exc, KeyboardInterrupt) else None)
    if isinstance(code, int) and code - 128 in STOP_SIGNALS:
        signum = code - 128  # a rank stopped at a signal (its run.save committed first)
    if signum is not None:
        return "stop", f"stopped by {signal.Signals(signum).name}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() and code is None else ""
    return "failure", text or (f"exited with code {code}" if code is not None
                               else type(exc).__name__)


@contextlib.contextmanager
def recorded(out: RunDir, started: str | None) -> Iterator[None]:
    """Record the run in OUT/events.jsonl — `started` (None: a restart, already recorded),
    then how it ended — and write OUT/report.html at the end, however it ends; unless the
    attempt was refused (see the module): then the directory is left as it was."""
    before = Before(out)
    if started is not None:
        record_unrecorded_end(out)
        record_event(out, "start", step_now(out, logged=False), started)
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, UserError) and not before.advanced():
            before.restore()
            raise
        kind, what = ending(exc)
        record_event(out, kind, step_now(out, logged=kind != "stop"), what)
        write_report(out)
        raise
    record_event(out, "end", step_now(out), "finished")
    write_report(out)


def record_unrecorded_end(out: RunDir) -> None:
    """When the run's last start/end/failure/stop event is a start (its attempt recorded
    no end: see the module), a failure event for it."""
    said = [e["kind"] for e in read_events(out) if e["kind"] in LIFECYCLE]
    if not said or said[-1] != "start":
        return
    step = step_now(out)
    record_event(out, "failure", step, "ended without a record (its launcher was killed, "
                 f"e.g. by SIGKILL, or its machine was lost); the run had reached step {step}",
                 when=_last_write(out))


def _last_write(out: RunDir) -> float | None:
    """When the run directory's files were last written: its events, metrics, the ranks'
    logs, a checkpoint committed (None: none of them is there)."""
    paths = [out.events, out.metrics, out.checkpoints, *Before(out)._logs()]
    times = []
    for path in paths:
        with contextlib.suppress(OSError):
            times.append(os.lstat(path).st_mtime)
    return max(times, default=None)


def write_report(out: RunDir) -> None:
    """OUT/report.html from metrics.jsonl and events.jsonl; a page that cannot be written
    is a warning (the run's own outcome is what the exit code says)."""
    from phalanx.report.run_report import build_report

    try:
        build_report(out.root)
    except (UserError, OSError, ValueError) as exc:
        print(f"phalanx: warning: no report page: {exc}", file=sys.stderr, flush=True)


class Before:
    """What an attempt found in the run directory: the sizes of the files it appends to
    (events.jsonl, each rank's log), and how far the run was (metrics, checkpoints)."""

    def __init__(self, out: RunDir) -> None:
        self.out = out
        self.logs_existed = out.logs.is_dir()
        self.sizes = {p: _size(p) for p in (out.events, *self._logs())}
        self.environment = _regular_bytes(out.environment)
        self.progress = self._progress()

    def _logs(self) -> list[Path]:
        return sorted(self.out.logs.glob("rank-*.log")) if self.out.logs.is_dir() else []

    def _progress(self) -> tuple:
        metrics = self.out.metrics
        stat = metrics.stat() if metrics.is_file() else None
        from phalanx.checkpoint.store import read_latest

        latest = read_latest(self.out.checkpoints)
        return (stat and (stat.st_size, stat.st_mtime_ns), latest and latest.name)

    def advanced(self) -> bool:
        """Whether the run moved on since: a metric logged or a checkpoint committed."""
        return self._progress() != self.progress

    def restore(self) -> None:
        """Take back what the attempt appended (files it created: removed)."""
        for path in {self.out.events, *self._logs()}:
            _truncate(path, self.sizes.get(path))
        if not self.logs_existed:
            with contextlib.suppress(OSError):
                self.out.logs.rmdir()
        if _regular_bytes(self.out.environment) != self.environment:  # phalanx.init's
            with contextlib.suppress(OSError):
                if self.environment is None:
                    self.out.environment.unlink()
                else:
                    atomic_write(self.out.environment, self.environment)


def _size(path: Path) -> int | None:
    try:
        return os.lstat(path).st_size
    except OSError:
        return None


def _regular_bytes(path: Path) -> bytes | None:
    """The bytes of the regular file `path`, read without following a link (None: no
    such file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read() if stat.S_ISREG(os.fstat(fd).st_mode) else None


def _truncate(path: Path, size: int | None) -> None:
    """`path` cut back to `size` bytes (None: removed), never through a link."""
    with contextlib.suppress(OSError):
        if size is None:
            path.unlink()
            return
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
