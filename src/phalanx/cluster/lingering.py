"""What a process leaves running when its work is done: threads that are not daemons.

The interpreter waits for every such thread before it exits, so one that a user's code
started and never ends (a `--model` factory's, a script's under `phalanx run`) kept the
process — and the job waiting for it — from ever ending. `end_despite_threads` ends the
process anyway, a grace period later, and says so in one line.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import os
import site
import sys
import sysconfig
import threading
import time
from pathlib import Path

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


def leave_at_once(code: int) -> None:
    """End the process with `code` now, skipping the interpreter's own teardown (freeing
    every module and tensor: about 0.6 s once torch is imported, paid by the launcher and
    by every rank at the end of each run, while the user waits for the prompt).

    Nothing is lost: the atexit functions run (logging, multiprocessing, temporary
    files), every open file's buffer is flushed, and only when no thread that is not a
    daemon still runs and no module from outside the installed environment (a user's
    `--model`/`--dataset` code, a test's sitecustomize) was imported here — such code may
    count on finalizers, so that process ends the usual way. Returns when it does not
    leave."""
    if _lingering() or _foreign_modules():
        return
    atexit._run_exitfuncs()
    _flush_open_files()
    flush_std()
    os._exit(code)


def _foreign_modules() -> list[str]:
    """Modules imported here from a file outside the standard library, the installed
    packages (and their console scripts, `phalanx` among them) and Phalanx itself."""
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")]
    roots += [*site.getsitepackages(), str(Path(__file__).parents[1])]
    prefixes = tuple({os.path.join(f(r), "") for r in roots if r
                      for f in (os.path.abspath, os.path.realpath)})
    return [name for name, module in list(sys.modules.items())
            if isinstance(file := getattr(module, "__file__", None), str)
            and os.path.isabs(file) and not file.startswith(prefixes)]


_FILE_TYPES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


def _flush_open_files() -> None:
    """Flush every open Python file object (as the interpreter's teardown would)."""
    for obj in gc.get_objects():
        if type(obj) in _FILE_TYPES:
            with contextlib.suppress(Exception):
                if not obj.closed:
                    obj.flush()


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


