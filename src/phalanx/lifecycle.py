"""How a job's processes end: with their launcher, and cleanly on Ctrl-C / SIGTERM.

- `die_with_agent()`: a worker started by an elastic agent (Phalanx's launcher or
  torchrun) asks the kernel for SIGKILL when that agent dies, so a launcher killed
  with SIGKILL never leaves workers training on, unsupervised (PR_SET_PDEATHSIG; a
  watcher thread where prctl is not available).
- `StopSignals`: the first SIGINT/SIGTERM only asks to stop: the training loop finishes
  its step, every rank agrees (one all-reduce per step), a checkpoint is committed and
  the process exits with 128 + the signal (130 / 143). The first signal also puts the
  default action back, so a second one stops the process at once.
  The agent forwards a signal it gets to its workers once (they run in sessions of
  their own, so a terminal's Ctrl-C reaches the launcher only).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1
# SIGUSR1: SLURM's warning before a time limit or preemption (`phalanx slurm`'s
# `--signal=USR1@S`): stop the same way, and the batch script requeues on exit code 138
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def die_with_agent() -> None:
    """In a worker of an elastic agent (Phalanx's launcher or torchrun): SIGKILL this
    process when the agent dies. Elsewhere: nothing."""
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        die_with_parent()


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies (idempotent)."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent died before prctl took effect
                    os.kill(os.getpid(), signal.SIGKILL)
                return
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                     name="phalanx-parent-watch").start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


def exit_code(signum: int) -> int:
    """The shell's code for a process stopped by `signum`: 130 for SIGINT, 143 for SIGTERM,
    138 for SIGUSR1."""
    return 128 + int(signum)


class StopSignals:
    """Turns the first SIGINT/SIGTERM into a request (`requested`), the second into the
    default action (immediate stop). Installs only in the main thread; `restore()` puts
    the previous handlers back."""

    def __init__(self) -> None:
        self.requested = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = self.requested or signum
        for sig in STOP_SIGNALS:  # a second signal: the default action, at once
            signal.signal(sig, signal.SIG_DFL)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
