"""What a failed job reports: which ranks caused it (and where they were), which lost the
connection to them, which were only stopped — from the failure records torch's elastic
agent collects (each worker's recorded error, exit code, crash record).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import sysconfig
from collections.abc import Callable
from types import FrameType

from phalanx.cluster.protocol import LAST_FAILURE
from phalanx.cluster.ranklogs import log_path
from phalanx.errors import DistributedError, PhalanxError, UserError
from phalanx.hang.crash import crashed_at, failed_at, traceback_frames
from phalanx.hang.mismatch import PEER_LOST
from phalanx.hang.stacks import describe, is_user
from phalanx.hang.static import static_citation
from phalanx.hang.watchdog import HANG_EXIT_CODE


def job_failed(failures: dict, max_restarts: int, host: str | None = None,
               reports: str | None = None, logs: str | None = None,
               memory: Callable[[], str] | None = None) -> Exception:
    """The error for a job whose ranks failed (`{rank: ProcessFailure}` of this node):
    a `UserError` with the first rank's message when the cause is a usage error (exit 2),
    else a `DistributedError` naming the ranks — and `host`, the machine they ran on,
    when the job spans several. `reports`: where crash records are (phalanx.hang.crash);
    `logs`: where the ranks' logs are (phalanx.cluster.ranklogs), named for the failed ranks;
    `memory()`: what to say of memory beside a rank killed by SIGKILL (the plan's predicted
    peak: phalanx.plan.oom), asked only then."""
    culprits, victims, stopped = _blame(failures)
    user = [r for r in culprits if failures[r].exitcode == 2 or
            (_stopped(failures[r].exitcode) and _usage_error(failures[r]))]
    if user and all(r in user or _stopped(failures[r].exitcode) for r in culprits):
        first = min(culprits)  # a user error (a rank stopped while exiting with it too)
        message = _message(failures[first]).split(": ", 1)[-1]
        return UserError(f"[rank {first}] {message}" if message else
                         f"ranks {culprits} stopped with a usage error.")
    killed = any(failures[r].exitcode == -signal.SIGKILL for r in culprits)
    note = (memory() if memory is not None and killed else "") or PLAN_HINT
    detail = _describe_all(culprits, failures, reports, note, logs)
    if victims:
        detail += (f"; then rank(s) {', '.join(map(str, victims))} lost the connection "
                   f"to it{_victims_at(victims, failures)}")
    if stopped:
        detail += f"; then rank(s) {', '.join(map(str, stopped))} were stopped"
    restarts = f" after {max_restarts} restart(s)" if max_restarts else ""
    where = f" on {host}" if host else ""
    return DistributedError(f"the job failed{restarts}{where}: {detail.rstrip('.')}."
                            + _logs_of(culprits + victims, logs), culprits)


def _usage_error(failure) -> bool:
    """The rank recorded a usage error (a `UserError`: a full disk, a bad path) and was
    stopped by the agent before it could exit with 2 — a peer failed at the same moment,
    losing the connection to it."""
    kind = _message(failure).split("] ", 1)[-1].split(":", 1)[0].strip()
    return kind in error_names(UserError)


def _logs_of(ranks: list[int], logs: str | None) -> str:
    """` Full output: out/logs/rank-1.log.` (the logs of the ranks that failed)."""

    paths = [log_path(logs, r) for r in ranks] if logs else []
    paths = [p for p in paths if p.is_file()]
    if not paths:
        return ""
    shown = [os.path.relpath(p) if not os.path.relpath(p).startswith("..") else str(p)
             for p in paths]
    return f" Full output: {', '.join(shown)}."


def unexplained_traceback(failures: dict) -> str | None:
    """The recorded traceback of the first failed rank whose error is not one Phalanx
    raises on purpose (a bug, or an error in the user's own script): shown once, while
    every rank's copy stays in its log."""
    culprits, _, _ = _blame(failures)
    for rank in culprits:
        raw = failures[rank].message
        if not isinstance(raw, dict):
            continue
        kind = str(raw.get("message", "")).split(":", 1)[0]
        stack = _callstack(failures[rank]).strip()
        if stack and kind not in error_names() and stack != "NoneType: None":
            return f"[rank {rank}] {stack}"
    return None


_SIGNALLED = re.compile(r"Signal \d+ \(\w+\) received by PID")


def _blame(failures: dict) -> tuple[list[int], list[int], list[int]]:
    """(culprits, victims, stopped) among the failed ranks.

    A culprit recorded an error of its own (even if the agent then stopped it), or, when
    none did, exited by itself; a victim's error says it lost a peer; the rest were
    stopped by the agent (SIGTERM) without an error of their own.
    """
    ranks = sorted(failures)
    messages = {r: _message(failures[r]) for r in ranks}
    victims = [r for r in ranks if any(m in messages[r] for m in PEER_LOST)]
    culprits = [r for r in ranks if messages[r] and r not in victims]
    if not culprits:
        culprits = [r for r in ranks if not _stopped(failures[r].exitcode)
                    and r not in victims] or victims or ranks
        victims = [r for r in victims if r not in culprits]
    stopped = [r for r in ranks if r not in culprits and r not in victims]
    return culprits, victims, stopped


def _stopped(code: int | None) -> bool:
    """The agent's SIGTERM ended the rank: killed by it, or (Phalanx's handler, a trainer
    stopping on it) exited with the shell's code for it, 143."""
    return code in (-signal.SIGTERM, 128 + signal.SIGTERM)


def _describe_all(culprits: list[int], failures: dict, reports: str | None,
                  memory: str, logs: str | None = None) -> str:
    """Each culprit's account; ranks that failed with the same error are named together."""
    same = {_message(failures[r]).split("] ", 1)[-1] for r in culprits}
    if len(culprits) > 1 and len(same) == 1 and "" not in same:
        return f"ranks {', '.join(map(str, culprits))} failed with: {same.pop()}"
    return "; ".join(_describe(r, failures[r], reports, memory, logs) for r in culprits)


def _victims_at(victims: list[int], failures: dict) -> str:
    """` (rank 1 in backward at train.py:143 in main())`, from their recorded tracebacks."""

    where = []
    for r in victims:
        act = _recorded_at(failures[r])
        if act is not None and act.site is not None:
            what = f"in {act.collective} " if act.collective else ""
            where.append(f"rank {r} {what}at {act.where()}")
    return f" ({'; '.join(where)})" if where else ""


def _callstack(failure) -> str:
    """The traceback text the agent recorded for a failed rank ('' without one)."""
    raw = failure.message
    info = raw.get("extraInfo", {}) if isinstance(raw, dict) else {}
    return str(info.get("py_callstack", ""))


def _recorded_at(failure):
    """Where the rank was when it raised (an Activity), from the traceback the agent
    recorded; None without one."""
    return failed_at(_callstack(failure))


def _raised_at(failure, message: str) -> str:
    """` (raised at train.py:12 in main(), under `if rank == 1:` at train.py:11)`: the
    innermost frame of the script's own in the last traceback recorded (not torch's, the
    standard library's, an installed package's or Phalanx's), for an error that is not
    Phalanx's own (those say where themselves); '' when unknown."""
    if message.partition(": ")[0] in error_names():
        return ""
    try:
        last = _callstack(failure).rsplit("Traceback (most recent call", 1)[-1]
        frames = [f for f in traceback_frames(last) if is_user(f) and _the_scripts(f.file)]
        if not frames:
            return ""
        place = describe(frames)  # (the rank condition around the innermost of them)
        under = f", under {place.condition}" if place.condition else ""
        return f" (raised at {place.where()}{under})"[:240]
    except Exception:  # noqa: BLE001 - the failure's account is said without it
        return ""


_LIBRARY_PATHS = tuple(os.path.realpath(p) + os.sep for p in {
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"],
    os.path.dirname(os.path.dirname(os.path.realpath(__file__)))})  # (Phalanx's own)


def _the_scripts(path: str) -> bool:
    """Whether `path` is the user's: not Phalanx's, torch's, the standard library's or an
    installed package's."""
    real = os.path.realpath(path)
    return "-packages" + os.sep not in real and not real.startswith(_LIBRARY_PATHS)


def _crashed_in(rank: int, code: int, reports: str | None, logs: str | None = None) -> str:
    """` in all_reduce at train.py:133 in run_val() (...), under ...` for a rank that
    died of a signal and left a crash record (see phalanx.hang.crash); for gloo's abort,
    what its check found, read from the rank's log (`logs`)."""

    act = crashed_at(reports, rank)
    if act is None or act.site is None:
        return ""
    what = f" in {act.collective}" if act.collective else ""
    gloo = ""
    if act.collective and code == -signal.SIGABRT:
        sizes = gloo_sizes(logs, rank)
        sent = (f"a peer sent {sizes[0]} bytes where {sizes[1]} were expected" if sizes
                else "a peer's message did not fit the collective")
        gloo = (f" — gloo aborted: {sent}, so the ranks ran this {act.collective} with "
                f"different sizes or dtypes, or ran different collectives (--debug-collectives "
                f"compares each collective's op, shapes and dtypes across the ranks)")
        if not act.condition:  # where they met is known; where they parted, maybe lint says
            cited = static_citation([act.user])
            gloo += f". {cited.rstrip('.')}" if cited else ""
    return f"{what} at {act.where()}{act.context()}{gloo}"


def _describe(rank: int, failure, reports: str | None, memory: str = "",
              logs: str | None = None) -> str:
    """`rank 1 exited with code 1: InjectedFault: ...` from the agent's failure record."""
    code, message = failure.exitcode, _message(failure)
    if code == HANG_EXIT_CODE and message:
        return f"the hang watchdog on rank {rank} stopped it: {message.split('] ', 1)[-1]}"
    if message and code == -signal.SIGTERM:
        text = f"rank {rank} failed (then the agent stopped it)"
    else:
        text = f"rank {rank} exited with code {code}"
        if code is not None and code < 0:
            text += f" (killed by signal {-code}){_crashed_in(rank, code, reports, logs)}"
        if code == -signal.SIGKILL:
            text += OOM_HINT.format(memory=memory or PLAN_HINT)
    if not message:
        return text
    return f"{text}: {_own_words(message, rank)[:300]}{_raised_at(failure, message)}"


# gloo's receive check (transport/tcp/pair.cc), in the aborting rank's stderr
_GLOO_SIZES = re.compile(rb"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")


def gloo_sizes(logs: str | None, rank: int) -> tuple[int, int] | None:
    """(bytes sent, bytes expected) from the last gloo receive-size abort in the end of
    rank `rank`'s log (read without following a link); None when it has none."""
    if not logs:
        return None
    try:
        fd = os.open(log_path(logs, rank), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 16384))
            found = _GLOO_SIZES.findall(fh.read())
    except OSError:
        return None
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def _own_words(message: str, rank: int) -> str:
    """A Phalanx error's message without its class name and the `[rank N] ` the account
    already says (`DistributedError: [rank 0] replica group 1: ...` → `replica group 1:
    ...`); another error's (the user's, torch's) as recorded, its class name informative."""
    kind, _, rest = message.partition(": ")
    return rest.removeprefix(f"[rank {rank}] ") if kind in error_names() else message


# a SIGKILL is never the rank's own doing; when nobody sent it, the kernel did
OOM_HINT = (" — SIGKILL comes from outside the rank: when nobody sent it, it is the kernel's "
            "out-of-memory killer (`dmesg -T | grep -i 'killed process'` or `journalctl -k` "
            "says so; {memory})")
PLAN_HINT = "`phalanx plan` with this run's flags predicts each rank's peak memory"


def _message(failure) -> str:
    """The first line of the error a worker recorded for the agent ('' if none)."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    if isinstance(message, str) and message and not message.startswith("To enable traceback") \
            and not _SIGNALLED.match(message):  # a signal says it was stopped, not why
        return message.strip().splitlines()[0]
    return ""



class RestartNotes(logging.Handler):
    """Catches the elastic agent's record of the worker failure that makes it restart the
    ranks (`failed (exitcode: -9) local_rank: 1 ...`) and leaves one line about it in the
    environment that the restarted workers copy (`LAST_FAILURE`): the next attempt's rank
    0 names the rank that died, in one line with the step it resumed from. `host`: this
    machine's name when the job spans several (its ranks are then local ranks).
    `on_failure` is told each line too (`phalanx run`'s launcher says the restart itself:
    its script may not be Phalanx's to say it)."""

    LOGGER = "torch.distributed.elastic.multiprocessing.api"
    def __init__(self, host: str | None,
                 on_failure: Callable[[str], None] | None = None, stops=None) -> None:
        super().__init__(logging.ERROR)
        self.host, self.on_failure, self.stops = host, on_failure, stops

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("failed (exitcode") or \
                not isinstance(record.args, tuple) or len(record.args) < 2:
            return
        if self.stops is not None and self.stops.requested:  # the ranks stopped as asked
            raise self.stops.exception()  # (ForwardedStops): the job stops, no restart
        code, local_rank = record.args[0], record.args[1]
        failures = _failures_being_logged()
        if failures:  # the agent names the earliest record, to the second: a rank it
            local_rank = min(_blame(failures)[0])  # stopped itself can tie with the one
            code = failures[local_rank].exitcode  # that died; blame as `job_failed` does
        who = f"local rank {local_rank} on {self.host}" if self.host else f"rank {local_rank}"
        how = f"exited with code {code}"
        if isinstance(code, int) and code < 0 and -code in signal.valid_signals():
            how = f"was killed by {signal.Signals(-code).name}"
        os.environ[LAST_FAILURE] = f"{who} {how}"
        if self.on_failure is not None:
            self.on_failure(f"{who} {how}")

    def __enter__(self) -> RestartNotes:
        log = logging.getLogger(self.LOGGER)
        self._saved = (log.level, log.propagate)
        log.setLevel(logging.ERROR)
        log.propagate = False  # not printed: rank 0 of the next attempt says it
        log.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        log = logging.getLogger(self.LOGGER)
        log.removeHandler(self)
        log.setLevel(self._saved[0])
        log.propagate = self._saved[1]
        os.environ.pop(LAST_FAILURE, None)


def _failures_being_logged() -> dict | None:
    """The process context's `{local_rank: ProcessFailure}` whose first failure the agent
    is logging (found on the logging call's stack; None if torch's layout differs)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        found = getattr(owner, "_failures", None)
        if isinstance(found, dict) and found:
            return dict(found)
        frame = frame.f_back
    return None


def error_names(root: type = PhalanxError) -> set[str]:
    """The class names of every error Phalanx raises on purpose (as recorded for the
    agent: `UserError: ...`): `root` and its subclasses."""
    import phalanx.checkpoint.safety  # noqa: F401 - defines subclasses
    import phalanx.checkpoint.store  # noqa: F401

    found, todo = set(), [root]
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return found
