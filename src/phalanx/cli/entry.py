"""The `phalanx` command and `python -m phalanx`: a Ctrl-C or SIGTERM at any moment —
while Phalanx and torch are still being imported, too — ends in one line (exit 130 /
143), never a traceback. Workers of Phalanx's launcher stay silent: the launcher says
it once. (Inside the training loop `lifecycle.StopSignals` takes over: the first signal
commits a checkpoint instead.)"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from phalanx.cluster import protocol
from phalanx.cluster.lifecycle import interrupted, release_sigint, terminate_gently


class Terminated(KeyboardInterrupt):
    """SIGTERM outside the training loop: unwinds like Ctrl-C's KeyboardInterrupt."""

    signum = signal.SIGTERM


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def main() -> int:
    terminate_gently(_terminate)  # a process stuck in C still ends, 10 s later
    try:
        release_sigint()  # a worker's Ctrl-C held while it started is raised here
        from phalanx.cli.dispatch import main as cli_main

        code = cli_main()
    except KeyboardInterrupt as exc:
        code = interrupted(exc)
    if code in (130, 143):  # stopped: said in one line; leave at once, so that nothing
        _flush()  # at interpreter exit (threads, atexit) can turn it into a traceback or
        os._exit(code)  # exit by the signal instead (seen once in 100 stops: rc -2)
    for sig in (signal.SIGINT, signal.SIGTERM):  # a signal while the interpreter exits
        signal.signal(sig, signal.SIG_DFL)  # (atexit, finalizers) ends it, no traceback
    end_despite_threads(code)
    return code


THREADS_GRACE_S = 3.0


def end_despite_threads(code: int, grace_s: float = THREADS_GRACE_S) -> None:
    """The interpreter waits for every thread that is not a daemon before it exits: one
    that a user's code started and never ends (a `--model` factory's, a script's) kept
    the process, and the job waiting for it, from ever ending. When such threads are
    running as the command returns, this process exits with `code` `grace_s` later if it
    is still here, saying so in one line (threads that end meanwhile are waited for)."""
    if not _lingering():
        return

    def later() -> None:
        time.sleep(grace_s)
        names = ", ".join(f"`{name}`" for name in dict.fromkeys(_lingering()))
        if not names:
            return
        where = f"[rank {os.environ.get('RANK', '?')}] " if protocol.phalanx_worker() else ""
        _flush()  # then fd 2: a rank's log only (the launcher says it on the console)
        with contextlib.suppress(OSError):
            os.write(2, f"phalanx: {where}ending the process although thread(s) {names} it "
                        f"started still run: Python would wait for them forever (they are "
                        f"not daemon threads). Start such a thread with daemon=True, or end "
                        f"it before returning.\n".encode())
        os._exit(code)

    threading.Thread(target=later, name="phalanx-exit", daemon=True).start()


def _lingering() -> list[str]:
    """The names of the running threads that are not daemons (the main thread aside)."""
    return [t.name for t in threading.enumerate()
            if not t.daemon and t.is_alive() and t is not threading.main_thread()]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


