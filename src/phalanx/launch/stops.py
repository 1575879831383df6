"""A stop signal reaching a launcher: the ranks decide how the job ends.

Torch's elastic agent turns a SIGINT/SIGTERM into `SignalException` at once: it forwards
the signal, waits 30 s, kills what is left, and the launcher could only say "stopped by
SIGINT" — also when a script that stops at its next `run.save` finished before any save
came (exit 0, nothing stopped). `ForwardedStops`, around the agent, forwards the first one
to the ranks (this process's children) and lets the agent go on watching them: all ranks
ending with 0 is a finished job; ranks ending on the signal are a stop (`RestartNotes`
raises `SignalException` then, instead of letting the agent restart them). A second
signal more than `StopSignals.GRACE_S` later, or one that finds no rank to tell (still
starting), is torch's: `SignalException` at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

from phalanx.cluster.lifecycle import StopSignals, child_processes

FORWARDED = (signal.SIGINT, signal.SIGTERM)
TORCH_HANDLES = "SIGHUP,SIGQUIT"  # the signals torch's agent raises on (its default less
# FORWARDED: `launch_config`)


class ForwardedStops:
    def __init__(self) -> None:
        self.requested = 0
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> ForwardedStops:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in FORWARDED}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.requested:
            if now - self._first_at > StopSignals.GRACE_S:
                raise self.exception(signum)
            return  # the same request arriving twice
        ranks = child_processes()
        if not ranks:
            raise self.exception(signum)
        self.requested, self._first_at = signum, now
        for pid in ranks:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    def exception(self, signum: int | None = None) -> BaseException:
        """Torch's own: its agent stops the ranks (forward, wait, kill) and re-raises it."""
        from torch.distributed.elastic.multiprocessing.api import SignalException

        sigval = signal.Signals(signum or self.requested)
        return SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
