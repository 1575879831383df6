"""The `phalanx` command and `python -m phalanx`: a Ctrl-C or SIGTERM at any moment —
while Phalanx and torch are still being imported, too — ends in one line (exit 130 /
143), never a traceback. Workers of Phalanx's launcher stay silent: the launcher says
it once. (Inside the training loop `lifecycle.StopSignals` takes over: the first signal
commits a checkpoint instead.)"""

from __future__ import annotations

import os
import signal

from phalanx.cluster.lifecycle import interrupted, release_sigint, terminate_gently
from phalanx.cluster.lingering import end_despite_threads, exit_code, flush_std, leave_at_once


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
    except BaseException as exc:  # SystemExit, or a bug's traceback (printed as it leaves):
        end_despite_threads(exit_code(exc))  # a lingering thread must not hang it either
        raise
    if code in (130, 143):  # stopped: said in one line; leave at once, so that nothing
        flush_std()  # at interpreter exit (threads, atexit) can turn it into a traceback or
        os._exit(code)  # exit by the signal instead (seen once in 100 stops: rc -2)
    for sig in (signal.SIGINT, signal.SIGTERM):  # a signal while the interpreter exits
        signal.signal(sig, signal.SIG_DFL)  # (atexit, finalizers) ends it, no traceback
    leave_at_once(code)  # without the interpreter's 0.6 s teardown, where nothing is lost
    end_despite_threads(code)
    return code
