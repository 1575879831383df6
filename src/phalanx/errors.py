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
        import signal

        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        name = signal.Signals(self.signum).name if self.signum in signal.valid_signals() \
            else f"signal {self.signum}"
        super().__init__(message or f"stopped by {name}.")
