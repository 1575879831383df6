"""What a process leaves running when its work is done: threads that are not daemons.

The interpreter waits for every such thread before it exits, so one that a user's code
started and never ends (a `--model` factory's, a script's under `phalanx run`) kept the
process — and the job waiting for it — from ever ending. `end_despite_threads` ends the
process anyway, a grace period later, and says so in one line.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from phalanx.cluster import protocol

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
        flush_std()  # then fd 2: a rank's log only (the launcher says it on the console)
        with contextlib.suppress(OSError):
            os.write(2, f"phalanx: {where}ending the process although thread(s) {names} it "
                        f"started still run: Python would wait for them forever (they are "
                        f"not daemon threads). Start such a thread with daemon=True, or end "
                        f"it before returning.\n".encode())
        os._exit(code)

    threading.Thread(target=later, name="phalanx-exit", daemon=True).start()


def exit_code(exc: BaseException) -> int:
    """The exit status Python gives a process that `exc` ends (SystemExit's own code; an
    uncaught exception: 1; Ctrl-C: 130)."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _lingering() -> list[str]:
    """The names of the running threads that are not daemons (the main thread aside)."""
    return [t.name for t in threading.enumerate()
            if not t.daemon and t.is_alive() and t is not threading.main_thread()]


def flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


