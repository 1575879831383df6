"""Errors that Phalanx raises on purpose.

A `UserError` is a mistake in what the user asked for (a flag, a file, a config key):
the CLI prints its message alone and exits with code 2, without a traceback. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os


class PhalanxError(Exception):
    """Base class of every error Phalanx raises deliberately."""


class UserError(PhalanxError):
    """Bad input: what was found, what was expected, how to fix it. Exit code 2."""

    exit_code = 2


class StorageFull(UserError):
    """A write failed because the disk is full, over quota or read-only."""


FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # no room left (not read-only)
_STORAGE_ERRNOS = FULL_ERRNOS | {errno.EROFS}


def storage_error(exc: BaseException, into: str | os.PathLike | None = None
                  ) -> StorageFull | None:
    """The user's error behind an OSError of a full, over-quota or read-only disk (wherever
    in a run it came: metrics, logs, a plot, an export); None for any other error. `into`:
    the directory being written, named when the error does not name its file. What
    Phalanx commits (checkpoints, `latest`) is written so that such a failure never leaves
    it half-written."""
    if not isinstance(exc, OSError) or exc.errno not in _STORAGE_ERRNOS:
        return None
    where = (f" writing `{exc.filename}`" if exc.filename else
             f" writing into `{into}`" if into else "")
    return StorageFull(f"{exc.strerror or os.strerror(exc.errno)}{where}. Free space or "
                       f"choose a writable location (e.g. `--out`), then run again.")


@contextlib.contextmanager
def storage_errors(into: str | os.PathLike | None = None):
    """Raise a full, over-quota or read-only disk met inside as the user's error
    (`storage_error`); any other error passes unchanged."""
    try:
        yield
    except OSError as exc:
        known = storage_error(exc, into)
        if known is None:
            raise
        raise known from exc


class DistributedError(PhalanxError):
    """A failure in a running job, naming the rank(s) it happened on."""

    def __init__(self, message: str, ranks: list[int] | None = None) -> None:
        self.ranks = list(ranks or [])
        prefix = f"[rank {', '.join(map(str, self.ranks))}] " if self.ranks else ""
        super().__init__(prefix + message)


class Interrupted(PhalanxError):
    """The job was stopped by a signal (Ctrl-C / SIGTERM); exits with 128 + the signal."""

    def __init__(self, signum: int, message: str = "") -> None:
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        super().__init__(message or stopped_line(self.signum, "", None))


class FinishedElsewhere(PhalanxError):
    """A torchft replica group (re)started after another group of its launch finished the
    run: nothing is left to train (alone, from its own step, it would make another run)."""

    def __init__(self, group: str, winner: str) -> None:
        self.group, self.winner = group, winner
        super().__init__(f"replica group {winner} has finished the run; group {group} "
                         f"(started again after it) has nothing left to train and ends")


def signal_name(signum: int) -> str:
    """SIGINT for 2; `signal 99` for a number that names no signal."""
    import signal

    return signal.Signals(signum).name if signum in signal.valid_signals() \
        else f"signal {signum}"


def stopped_line(signum: int, kept: str, command: str | None) -> str:
    """How a stopped run ends (`phalanx train`, `phalanx run`, a torchft group): the signal,
    what the run keeps (`kept`, e.g. "checkpoint step-40 is committed"; "": nothing to say)
    and the command that resumes it (None: another process says it)."""
    line = f"stopped by {signal_name(signum)}{': ' + kept if kept else ''}"
    return f"{line}." if command is None else f"{line}. Resume with: {command}"


def first_line(exc: BaseException) -> str:
    """`ValueError: the message's first line` (the type alone when it has no message)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
