"""How a job's processes end: with their launcher, and cleanly on Ctrl-C / SIGTERM.

- `die_with_agent()`: a worker started by an elastic agent (Phalanx's launcher or
  torchrun) asks the kernel for SIGKILL when that agent dies, so a launcher killed
  with SIGKILL never leaves workers training on, unsupervised (PR_SET_PDEATHSIG; a
  watcher thread where prctl is not available).
- `ends_descendants()`: a launcher adopts what its ranks leave behind (a process a rank
  started, even in a session of its own, is re-parented to the launcher when the rank
  ends: PR_SET_CHILD_SUBREAPER) and kills it when the job ends, so nothing a rank forked
  outlives the job.
- `StopSignals`: the first SIGINT/SIGTERM only asks to stop: the training loop finishes
  its step, every rank agrees (one all-reduce per step), a checkpoint is committed and
  the process exits with 128 + the signal (130 / 143). A second one, more than two
  seconds later, stops the process at once (even with its main thread stuck in C).
  The agent forwards a signal it gets to its workers once (they run in sessions of
  their own, so a terminal's Ctrl-C reaches the launcher only).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from phalanx.cluster import protocol

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# SIGUSR1: SLURM's warning before a time limit or preemption (`phalanx slurm`'s
# `--signal=USR1@S`): stop the same way, and the batch script requeues on exit code 138
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def die_with_agent() -> None:
    """In a worker of an elastic agent (Phalanx's launcher or torchrun), or in a torchft
    replica group (started by `phalanx.ft.groups`): SIGKILL this process when the process
    that started it dies. Elsewhere: nothing."""
    if os.environ.get("TORCHELASTIC_RUN_ID") or protocol.in_replica_group():
        die_with_parent()


def die_with_parent() -> None:
    """SIGKILL this process when the process that started it dies (idempotent) — or now,
    when the Phalanx launcher that started it is gone already: one stopped while this
    process was still starting (a Ctrl-C during the agent's spawn) left it waiting for a
    store, alone, its parent already init. Phalanx's launchers give their pid
    (`PHALANX_LAUNCHER_PID`)."""
    parent = os.getppid()
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL):
        if os.getppid() != parent or not _launcher_alive():  # died before prctl
            os.kill(os.getpid(), signal.SIGKILL)
        return
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                     name="phalanx-parent-watch").start()


def _prctl(option: int, value: int) -> bool:
    """`prctl(option, value)` on Linux; False where it is not available or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def ends_descendants(say=lambda line: print(line, file=sys.stderr, flush=True)):
    """For a launcher, around the run of its ranks: every process a rank leaves behind is
    re-parented here (not to init) and, when the job ends, killed with its process group
    and reaped; `say` is told how many, in one line. (Linux; elsewhere nothing is done.)"""
    adopting = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield
    finally:
        if adopting:
            ended = _end_adopted()
            _prctl(PR_SET_CHILD_SUBREAPER, 0)
            if ended:
                shown = ", ".join(map(str, ended[:6])) + (", …" if len(ended) > 6 else "")
                say(f"phalanx: ended {len(ended)} process(es) the ranks left running "
                    f"(pid {shown}): nothing a rank starts outlives the job")


def _end_adopted() -> list[int]:
    """SIGKILL (and reap) this process's children outside its own session — the ranks'
    leftovers; the ranks themselves have been reaped — until none is left (killing one
    re-parents its own children here)."""
    ended: list[int] = []
    own, seen = os.getsid(0), set()
    for _ in range(100):
        found = [(pid, group, state) for pid, state, parent, group, session in _processes()
                 if parent == os.getpid() and session != own and pid not in seen]
        if not found:
            break
        for pid, group, state in found:
            if state != "Z":  # (one that ended by itself is only reaped)
                with contextlib.suppress(OSError):
                    os.killpg(group, signal.SIGKILL)  # what it started in its group, too
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)
            seen.add(pid)
    return ended


def child_processes() -> list[int]:
    """This process's children that still run (a launcher's ranks)."""
    return [pid for pid, state, parent, _, _ in _processes()
            if parent == os.getpid() and state not in ("Z", "X")]


def _processes() -> list[tuple[int, str, int, int, int]]:
    """(pid, state, parent, process group, session) of each process (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            found.append((int(entry), *stat))
    return found


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent, process group, session) of `pid` from /proc, or None (gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state, parent, group, session = fh.read().rsplit(")", 1)[1].split()[:4]
        return state, int(parent), int(group), int(session)
    except (OSError, IndexError, ValueError):
        return None


def _launcher_alive() -> bool:
    """Whether the launcher named in the environment (if any) still runs."""
    told = os.environ.get(protocol.LAUNCHER_PID, "")
    if not told.isdigit():
        return True
    stat = _stat(int(told))
    return stat is not None and stat[0] not in ("Z", "X")  # exited, not yet reaped: gone


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def sigint_held_for_workers(hold: bool = True):
    """While torch's agent starts Phalanx's own workers (`-m phalanx …`), they inherit a
    blocked SIGINT (a thread's signal mask survives fork and exec): a Ctrl-C the agent
    forwards while a worker is still importing waits, pending, until `release_sigint()`
    in `phalanx.cli.entry`, and ends there in one exit code — not in a KeyboardInterrupt
    traceback from Python's import machinery, which no code of ours could catch (seen
    in CI: SIGINT 2 s after start, both ranks inside runpy). This process still takes
    SIGINT: a thread started before the block receives it, and CPython runs the Python
    handler in the main thread as always (within the agent's 0.1 s monitor interval).
    User scripts (`phalanx run script.py`) are started as torchrun starts them."""
    usable = hasattr(signal, "pthread_sigmask") and (
        threading.current_thread() is threading.main_thread())
    if not hold or not usable:
        yield
        return
    done = threading.Event()
    threading.Thread(target=done.wait, daemon=True, name="phalanx-sigint").start()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        done.set()


def release_sigint() -> None:
    """Unblock SIGINT in this thread (a worker's first step, see
    `sigint_held_for_workers`): a Ctrl-C that came while it started arrives now."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def exit_code(signum: int) -> int:
    """The shell's code for a process stopped by `signum`: 130 for SIGINT, 143 for SIGTERM,
    138 for SIGUSR1."""
    return 128 + int(signum)


class StopSignals:
    """Turns the first SIGINT/SIGTERM/SIGUSR1 into a request (`requested`); another one
    more than `GRACE_S` later stops the process at once (exit 128 + the signal).

    The handlers are never changed while a signal may be pending: CPython runs the
    handlers of signals that arrived together one after another, and a handler that
    switched another signal to SIG_DFL made CPython raise `OSError: Signal 15 ignored
    due to race condition` wherever the main thread was (e.g. in autograd's engine)
    when SIGINT and SIGTERM arrived at once — the agent forwarding one signal while
    another reached the worker. Signals are also counted by a thread that reads
    CPython's wakeup fd, so a second signal stops a process whose main thread is stuck
    in C code (a collective that never returns), where no Python handler can run.
    A signal within `GRACE_S` of the first is the same request arriving twice (the
    agent's forward of a Ctrl-C that also reached the worker, or SIGINT then SIGTERM).

    Installs only in the main thread; `restore()` puts the previous handlers back. A
    request caught by an enclosing StopSignals (installed earlier, e.g. during
    start-up) carries over."""

    GRACE_S = 2.0

    def __init__(self, on_request: Callable[[int], None] | None = None) -> None:
        self.on_request = on_request  # told the first request as it arrives
        self.requested = 0
        self._first_at: float | None = None
        self._previous: dict[int, Any] = {}
        self._wakeup: tuple[socket.socket, socket.socket, int] | None = None

    def install(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._watch_wakeup_fd()  # first: a signal arriving from here on is counted
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
            outer = getattr(self._previous[sig], "__self__", None)
            if isinstance(outer, StopSignals) and outer.requested and not self.requested:
                self.requested, self._first_at = outer.requested, outer._first_at
        return self

    def _watch_wakeup_fd(self) -> None:
        watched = watch_signals(
            lambda signum: self._arrived(signum) if signum in STOP_SIGNALS else None,
            "phalanx-stop-signals")
        if watched is not None:
            self._wakeup = watched

    def _handle(self, signum: int, frame: Any) -> None:
        if self._wakeup is None:  # no counting thread: count here
            self._arrived(signum)

    def _arrived(self, signum: int) -> None:
        now = time.monotonic()
        if not self.requested:
            self.requested, self._first_at = signum, now
            if self.on_request is not None:
                self.on_request(signum)
        elif self._first_at is not None and now - self._first_at > self.GRACE_S:
            sys.stderr.flush()
            os._exit(exit_code(signum))  # the second request: stop at once

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}
        if self._wakeup is not None:
            unwatch(self._wakeup)
            self._wakeup = None


def watch_signals(seen, name: str) -> tuple[socket.socket, socket.socket, int] | None:
    """Call `seen(signum)` from a thread for every signal that reaches a Python handler,
    as it arrives — also while the main thread is stuck in C, where the handler itself
    cannot run (CPython's wakeup fd carries each signal's number). The previous wakeup
    fd comes back with `unwatch`. None where it cannot be set (not the main thread)."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        old = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        reader.close()
        writer.close()
        return None
    # the thread holds both ends: the writer's descriptor is CPython's wakeup fd, and must
    # live as long as it is (closed early, its number could be some other file's)
    threading.Thread(target=_read_signals, args=(reader, seen, writer), daemon=True,
                     name=name).start()
    return reader, writer, old


def _read_signals(reader: socket.socket, seen, writer: socket.socket) -> None:
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            seen(signum)


def unwatch(watched: tuple[socket.socket, socket.socket, int]) -> None:
    reader, writer, old = watched
    signal.set_wakeup_fd(old)
    writer.close()
    reader.close()


def _forget_wakeup_fd() -> None:
    """In a forked child (a DataLoader worker): its signals are its own, not counted by
    the parent's thread (which the child does not have)."""
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from another thread than the main one
        pass


os.register_at_fork(after_in_child=_forget_wakeup_fd)


class _LastResort:
    """SIGTERM outside the training loop raises `Terminated` (one line, exit 143); if the
    process is still there `delay_s` later — its main thread stuck in C, where no Python
    handler runs — it exits 143 at once, as the default action would have."""

    def __init__(self, handler, delay_s: float) -> None:
        self.handler, self.delay_s = handler, delay_s

    def __call__(self, signum: int) -> None:
        if signum == signal.SIGTERM:
            threading.Thread(target=self._later, daemon=True).start()

    def _later(self) -> None:
        time.sleep(self.delay_s)
        if signal.getsignal(signal.SIGTERM) is self.handler:  # nobody took it over
            os._exit(exit_code(signal.SIGTERM))


def terminate_gently(handler, delay_s: float = 10.0) -> None:
    """Install `handler` for SIGTERM (where the default action is in place) with the
    last resort above. For `phalanx.cli.entry`, before anything heavy is imported."""
    if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return
    if watch_signals(_LastResort(handler, delay_s), "phalanx-sigterm") is not None:
        signal.signal(signal.SIGTERM, handler)


def interrupted(exc: BaseException | None = None) -> int:
    """One line (none in a worker of Phalanx's launcher); the shell's exit code."""
    signum = getattr(exc, "signum", signal.SIGINT)
    if not protocol.phalanx_worker():
        what = "interrupted" if signum == signal.SIGINT else f"stopped by {signum.name}"
        try:
            print(f"phalanx: {what}", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr is gone: the exit code says it
            pass
    return 128 + int(signum)
