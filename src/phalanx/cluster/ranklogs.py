"""Quiet ranks: under Phalanx's launcher every rank writes its output to
`DIR/rank-<R>.log`, and the console shows rank 0's progress and, when the job fails, the
launcher's one-line diagnosis with the path of the log that holds the traceback.

The launcher names DIR in PHALANX_RANK_LOGS for its workers (`phalanx train`: OUT/logs,
`phalanx watch`: REPORT_DIR/logs); `--tee-ranks` leaves it unset and every rank writes to
the console as before. Under another launcher (torchrun, srun) nothing changes: that
launcher owns the output.

- rank > 0: file descriptors 1 and 2 point at the log (Python, C++ and gloo output alike).
- rank 0: stdout stays on the console (progress, the user's own prints); Python-level
  stderr goes to the console and the log; fd 2 itself (C++ / gloo) goes to the log only.
- a worker's uncaught error: its traceback goes to the log only (`log_traceback`); the
  launcher prints the diagnosis once, and a traceback once when the error is not one
  Phalanx explains (a bug, or an error in the user's script).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from phalanx.cluster import protocol
from phalanx.errors import UserError
from phalanx.paths import ensure_dir, open_append

_FILE_ENV = protocol.RANK_LOG_FILE  # set in a worker once its output goes to this file


def log_path(directory: str | os.PathLike, rank: int | str) -> Path:
    return Path(directory) / f"rank-{rank}.log"


class _Tee:
    """A text stream that writes to two (rank 0's stderr: the console and its log)."""

    def __init__(self, console, log) -> None:
        self._console, self._log = console, log

    def write(self, text: str) -> int:
        self._log.write(text)
        return self._console.write(text)

    def flush(self) -> None:
        self._log.flush()
        self._console.flush()

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the console's
        return getattr(self._console, name)


def quiet_worker() -> Path | None:
    """Send this worker's output to its rank log when its launcher asks (PHALANX_RANK_LOGS);
    the log's path, or None where it does not."""
    directory, rank = os.environ.get(protocol.RANK_LOGS), os.environ.get("RANK")
    if os.environ.get(_FILE_ENV) or not directory or rank is None:
        return Path(os.environ[_FILE_ENV]) if os.environ.get(_FILE_ENV) else None
    path = log_path(directory, rank)
    try:  # the launcher refused a run directory holding links; one planted since: refused
        ensure_dir(path.parent)
        fd = open_append(path)
    except UserError as exc:  # before the CLI's own handler: said here, in its words
        print(f"phalanx: error: [rank {rank}] {exc}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None
    stream = os.fdopen(fd, "a", buffering=1, encoding="utf-8", errors="replace")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    stream.write(f"=== rank {rank} on {socket.gethostname()}, pid {os.getpid()}, attempt "
                 f"{attempt}, {datetime.datetime.now().isoformat(timespec='seconds')} ===\n")
    sys.stdout.flush()
    sys.stderr.flush()
    if rank != "0":
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    else:
        console = os.fdopen(os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding,
                            errors="backslashreplace")
        os.dup2(fd, 2)
        sys.stderr = _Tee(console, stream)
    os.environ[_FILE_ENV] = str(path)
    return path


@contextlib.contextmanager
def rank_log() -> Iterator[TextIO | None]:
    """This rank's log, open for appending; None when output is not quieted (or the log
    was replaced by a link: not written through)."""
    path = os.environ.get(_FILE_ENV)
    if not path:
        yield None
        return
    sys.stderr.flush()
    try:
        fd = open_append(path)
    except (OSError, UserError):
        yield None
        return
    with os.fdopen(fd, "a", encoding="utf-8", errors="replace") as log:
        yield log


def log_traceback(exc: BaseException) -> bool:
    """Write `exc`'s traceback to this rank's log; False when output is not quieted (the
    caller shows it as usual)."""
    with rank_log() as log:
        if log is None:
            return False
        log.write("".join(traceback.format_exception(exc)))
    return True
