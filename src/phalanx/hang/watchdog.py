"""The hang watchdog: every rank keeps a heartbeat; when no rank has progressed for
`timeout` seconds, one report says where each rank is and why the job is stuck, and the
job exits (code 3) so an elastic restart can take over.

Progress is a `beat()` (the trainer's steps, `run.loader` batches), any change of the
main thread's Python stack, or a collective issued on the default process group (torch's
sequence number moved) — so an unmodified script is watched too: a rank blocked in a
collective has the same stack and issues nothing for as long as it waits, while a slow
healthy loop, whose stack may look the same at every look, still issues collectives (not
counted for a rank more than AHEAD collectives beyond another's: `_idle`).

Every rank runs one daemon thread, talking through torch's own store (a client of the
job's TCPStore, under a key prefix of its own): it publishes `hb/<rank>` (step, phase,
seconds idle), answers a stack request with its main thread's stack, and — on the
reporting rank (the lowest rank still publishing) — decides that the job hangs, asks
every rank for its stack (and the collective torch's flight recorder has it in, when
that is on: flight_recorder.py), writes the report and stops the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.cluster import protocol
from phalanx.cluster.protocol import record_for_agent
from phalanx.cluster.rendezvous import restart_attempt
from phalanx.errors import DistributedError, UserError
from phalanx.hang import flight_recorder, parting
from phalanx.hang.crash import CrashRecorder
from phalanx.hang.diagnosis import build_report
from phalanx.hang.stacks import Frame, live_wrappers, main_frame, rank_stack
from phalanx.paths import HANG_REPORT, atomic_write

HANG_EXIT_CODE = 3
AHEAD = 64  # collectives one rank may have issued beyond another's and still progress
HISTORY_WAIT_S = 10.0  # for the ranks' recorded collectives, once their stacks came
REPORT_NAME = HANG_REPORT


@dataclass
class Beat:
    step: int = -1
    phase: str = "start"
    at: float = 0.0  # time.monotonic() of the last progress
    moved_at: float = 0.0  # of the last progress not counting collectives issued
    issued: int | None = None  # collectives issued on the default group (collectives_issued)
    optimizer_steps: int = 0  # torch optimizers' `step()` calls in this process


class Watchdog:
    def __init__(self, store, rank: int, world_size: int, timeout: float,
                 report_dir: str | Path | None = None, *, poll: float | None = None) -> None:
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self.report_dir = Path(report_dir) if report_dir is not None else Path.cwd()
        self.poll = poll or min(2.0, max(0.2, timeout / 10))
        self.beat_state = Beat(at=time.monotonic(), moved_at=time.monotonic())
        self._last_stack: tuple | None = None
        self._seq = 0
        self._seen: dict[int, tuple[int, float]] = {}  # rank → (seq, when it changed)
        self._answered = False
        self._started = time.time()  # flight recorder dumps older than this are not ours
        self._flight: dict[int, dict | None] = {}  # rank → its flight recorder answer
        self._stop = threading.Event()
        self.crashes: CrashRecorder | None = None  # from start_watchdog
        self.hook: Any = None  # the optimizer step hook's handle, from start_watchdog
        self._thread = threading.Thread(target=self._loop, name="phalanx-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self.hook is not None:
            self.hook.remove()
            self.hook = None
        if self.crashes is not None:
            self.crashes.close()
            self.crashes = None

    def count_optimizer_step(self, optimizer, *_) -> None:
        """A global optimizer step hook: how many steps this rank took, for a report of
        uneven inputs in a script that reports no steps itself. A ZeroRedundancyOptimizer
        steps its inner optimizer, which counts: the wrapper's own step does not."""
        if type(optimizer).__name__ != "ZeroRedundancyOptimizer":
            self.beat_state.optimizer_steps += 1

    def finished(self) -> None:
        """The script returned on this rank: say so in the store, with its counts, for a
        peer still in a collective to tell uneven inputs from a crash."""
        b = self.beat_state
        with contextlib.suppress(Exception):  # the store is gone: the job is ending
            self.store.set(f"done/{self.rank}", json.dumps(
                {"step": b.step, "optimizer_steps": b.optimizer_steps}))

    def finished_ranks(self, wait: float = 0.0) -> dict[int, dict]:
        """The other ranks whose script returned (see `finished`): rank → its counts,
        waiting up to `wait` seconds for one."""
        deadline = time.monotonic() + wait
        while True:
            try:
                done = {r: json.loads(self.store.get(f"done/{r}"))
                        for r in range(self.world_size)
                        if r != self.rank and self.store.check([f"done/{r}"])}
            except Exception:  # the store is gone
                return {}
            if done or time.monotonic() >= deadline:
                return done
            time.sleep(0.1)

    def beat(self, step: int | None = None, phase: str | None = None) -> None:
        """Record progress (cheap: no I/O; the thread publishes it)."""
        b = self.beat_state
        if step is not None:
            b.step = step
        if phase is not None:
            b.phase = phase
        b.at = b.moved_at = time.monotonic()

    # -- the thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._tick()
            except Exception as exc:  # the store is gone: the job is ending
                if not self._stop.is_set():
                    print(f"[rank {self.rank}] hang watchdog stopped: {exc}", file=sys.stderr)
                return

    def _tick(self) -> None:
        self._sample_stack()
        b = self.beat_state
        self._seq += 1
        self.store.set(f"hb/{self.rank}", json.dumps({
            "step": b.step, "phase": b.phase, "idle": time.monotonic() - b.at,
            "idle_moved": time.monotonic() - b.moved_at, "issued": b.issued,
            "seq": self._seq, "pid": os.getpid(), "host": socket.gethostname(),
            "optimizer_steps": b.optimizer_steps}))
        if not self._answered and self.store.check(["dump"]):
            self._answered = True
            self.store.set(f"stack/{self.rank}", _stack_answer(self.rank))
            if flight_recorder.enabled():  # (after the stack: it is slow the first time)
                self.store.set(f"history/{self.rank}", _history_answer(self.rank))
            self._await_abort()
        if self.store.check(["abort"]):
            self._exit(report=None)
        beats = self._heartbeats()  # one read of every rank's heartbeat per tick
        idle = self._idle(beats)
        if self._is_reporter() and min(idle.values()) >= self.timeout:
            self._report_and_exit(beats)

    def _sample_stack(self) -> None:
        """A changed main-thread stack, or a collective issued since, is progress (the
        latter only while this rank is not far ahead of the others': `_idle`)."""
        frame = main_frame()
        key = None if frame is None else (id(frame), frame.f_lineno)
        b, issued, now = self.beat_state, collectives_issued(), time.monotonic()
        if key != self._last_stack:
            self._last_stack = key
            b.at = b.moved_at = now
        elif issued != b.issued:
            b.at = now
        b.issued = issued

    def _heartbeats(self) -> dict[int, dict]:
        keys = [f"hb/{r}" for r in range(self.world_size)]
        present = {r for r, k in enumerate(keys) if self.store.check([k])}
        values = self.store.multi_get([keys[r] for r in sorted(present)]) if present else []
        return {r: json.loads(v) for r, v in zip(sorted(present), values)}

    def _idle(self, beats: dict[int, dict]) -> dict[int, float]:
        """Each rank's idle seconds, counting the time since its last publication too (a
        rank that stopped publishing is not progressing either)."""
        now, idle = time.monotonic(), {}
        counts = [hb["issued"] for hb in beats.values() if hb.get("issued") is not None]
        for r in range(self.world_size):
            hb = beats.get(r)
            if hb is None:
                idle[r] = now - self._seen.setdefault(r, (-1, now))[1]
                continue
            seq, since = self._seen.get(r, (None, now))
            if seq != hb["seq"]:
                self._seen[r] = (hb["seq"], now)
                since = now
            # a rank issuing collectives far ahead of another's (async ones never waited
            # for, a thread of its own) is not progressing with the job
            ahead = hb.get("issued") is not None and hb["issued"] - min(counts) > AHEAD
            idle[r] = hb["idle_moved" if ahead else "idle"] + (now - since)
        return idle

    def _is_reporter(self) -> bool:
        """Rank 0, or the lowest rank whose lower peers stopped publishing (as `_idle`
        last saw them)."""
        if self.rank == 0:
            return True
        now, gone = time.monotonic(), self.timeout + 5 * self.poll
        return all(now - self._seen.get(r, (None, now))[1] > gone for r in range(self.rank))

    def _report_and_exit(self, beats: dict[int, dict]) -> None:
        self.store.set("dump", "1")
        stacks, wrappers = self._collect_stacks(
            deadline=time.monotonic() + max(5.0, 3 * self.poll))
        parted, dumped = self._parted([r for r, s in stacks.items() if s])
        flight = flight_recorder.section(self.world_size, self._flight, since=self._started,
                                         dumped=dumped)
        text, summary = build_report(stacks, beats, self.timeout, self.world_size, wrappers,
                                     finished=self.finished_ranks(), flight=flight,
                                     parted=parted)
        path = self.report_dir / REPORT_NAME
        try:
            self.report_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, text + "\n")  # a link planted there: replaced
            text += f"\n(report written to {path})"
        except OSError as exc:
            text += f"\n(could not write {path}: {exc.strerror})"
        print(text, file=sys.stderr, flush=True)
        self._exit(report=f"{summary} Full report: {path}")

    def _collect_stacks(self, deadline: float) -> tuple[dict, dict]:
        """Every rank's stack (None: no answer) and its live torch wrappers."""
        if not self._answered:  # our own, directly
            self._answered = True
            self.store.set(f"stack/{self.rank}", _stack_answer(self.rank))
        stacks: dict[int, list[Frame] | None] = {}
        wrappers: dict[int, frozenset[str]] = {}
        while time.monotonic() < deadline and len(stacks) < self.world_size:
            for r in range(self.world_size):
                if r not in stacks and self.store.check([f"stack/{r}"]):
                    raw = json.loads(self.store.get(f"stack/{r}"))
                    stacks[r] = [Frame(**f) for f in raw["frames"]]
                    wrappers[r] = frozenset(raw["wrappers"])
                    self._flight[r] = raw.get("flight")
            time.sleep(0.1)
        return {r: stacks.get(r) for r in range(self.world_size)}, wrappers

    def _parted(self, answered: list[int]) -> tuple[str | None, list[int]]:
        """With the flight recorder on: where the ranks' recorded collectives first differ
        (hang.parting), from this rank's history and those of the ranks that answered
        (each waited for up to HISTORY_WAIT_S), and the ranks that wrote their dump; (None,
        []) otherwise."""
        if not flight_recorder.enabled():
            return None, []
        self.store.set(f"history/{self.rank}", _history_answer(self.rank))
        found: dict[int, dict] = {}
        deadline = time.monotonic() + HISTORY_WAIT_S
        while time.monotonic() < deadline and len(found) < len(answered):
            for r in answered:
                if r not in found and self.store.check([f"history/{r}"]):
                    found[r] = json.loads(self.store.get(f"history/{r}"))
            time.sleep(0.1)
        return (parting.parted({r: a.get("history") for r, a in found.items()}),
                sorted(r for r, a in found.items() if a.get("dumped")))

    def _await_abort(self) -> None:
        """A hang is being reported: the job is ending. Wait for the reporter to go first
        (its account is the one the agent should see), then leave without a second one
        (its exit surfaces here as a 'Connection closed by peer' traceback)."""
        _silence_stderr()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.store.check(["abort"]):
            time.sleep(0.05)
        os._exit(HANG_EXIT_CODE)

    def _exit(self, report: str | None) -> None:
        """Leave now: the main thread is blocked and will not return. The reporter records
        the one-line summary for the elastic agent and goes first; the others follow."""

        if report is not None:
            record_for_agent(DistributedError(report, [self.rank]))
            _silence_stderr()
            self.store.set("abort", "1")
        else:
            time.sleep(0.5)
        os._exit(HANG_EXIT_CODE)


def collectives_issued() -> int | None:
    """The default process group's count of collectives issued (torch's sequence number;
    None before the group exists, or in a torch without it)."""
    import torch.distributed as dist

    try:
        if not dist.is_initialized():
            return None
        group = dist.distributed_c10d._get_default_group()
        count = getattr(group, "_get_sequence_number_for_group", None)
        return None if count is None else int(count())
    except Exception:  # noqa: BLE001 - never the watchdog's end (the group may be going)
        return None


def _stack_answer(rank: int) -> str:
    return json.dumps({"frames": [f.__dict__ for f in rank_stack()],
                       "wrappers": live_wrappers(),
                       "flight": flight_recorder.own_last(rank)})


def _history_answer(rank: int) -> str:
    """With the flight recorder on: this rank's recorded collectives with their frames
    (hang.parting), its dump written for torch's analyser on the way. Slow the first time
    (torch gathers the stacks: ~3-4 s here), so it follows the stack answer."""
    dump = flight_recorder.own_dump(stacks=True)
    written = None if dump is None else flight_recorder.write_own_dump(rank, dump)
    return json.dumps({"history": parting.history(dump), "dumped": written is not None})


def _silence_stderr() -> None:
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)


def timeout_from_env(default: str = "0") -> float:
    """PHALANX_HANG_TIMEOUT in seconds (0: off), or a UserError naming the bad value."""

    raw = os.environ.get(protocol.HANG_TIMEOUT, "") or default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise UserError(f"PHALANX_HANG_TIMEOUT is `{raw}`; expected seconds >= 0 (0: off).")
    return value


def job_store(world_size: int, namespace: str = "watchdog"):
    """A client of the job's store (what torchrun/Phalanx's agent or rank 0 serves), under
    a prefix of its own; an in-process store for a 1-process job."""
    import torch.distributed as dist

    attempt = str(restart_attempt())
    if world_size == 1 or "MASTER_ADDR" not in os.environ:
        return dist.HashStore()
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           world_size, is_master=False, wait_for_workers=False)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "job")
    return dist.PrefixStore(f"/phalanx/{namespace}/{run_id}/{attempt}", client)


def start_watchdog(rank: int, world_size: int, timeout: float,
                   report_dir: str | Path | None = None) -> Watchdog:
    """Start the watchdog thread, and record this rank's stacks should it die of a fatal
    signal (see crash.py); both stop at `Watchdog.stop()` or at exit."""
    import atexit


    dog = Watchdog(job_store(world_size), rank, world_size, timeout, report_dir)
    dog.crashes = CrashRecorder(dog.report_dir, rank)
    atexit.register(dog.stop)
    from torch.optim.optimizer import register_optimizer_step_post_hook

    dog.hook = register_optimizer_step_post_hook(dog.count_optimizer_step)
    return dog.start()
