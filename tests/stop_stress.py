"""Stops at random moments (issue 25, item 1): start `phalanx train` (2 gloo ranks, a
tiny model), send SIGINT to its process group (a terminal's Ctrl-C) or SIGTERM to the
launcher at one of eight moments, then check what a user relies on.

The moments: start-up, the first step, mid-step, a checkpoint write (sync and async),
evaluation, the final export and an elastic restart. A window that is too short to hit
by timing alone is widened with `PHALANX_FAULT=...,action=pause` (2 s at that point,
announced on stderr as `phalanx-fault: pause at ...`).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import procs
from phalanx.checkpoint.store import committed, verify

STEPS = 24
RECEIVED = re.compile(r"^phalanx: SIG[A-Z]+ received after step (\d+) of ", re.M)
KEEP = 2  # --keep-checkpoints: the stops may meet a rotation (8, 16, a stop's, 24)
ARGS = ["--keep-checkpoints", str(KEEP), "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "12", "--eval-batches", "2",
        "--log-every", "1", "--sample-tokens", "20", "--checkpoint-every", "8",
        "--nproc-per-node", "2", "--threads-per-rank", "1", "--max-steps", str(STEPS),
        "--hang-timeout-s", "0"]
MOMENTS = ["start-up", "first step", "mid-step", "checkpoint (sync)", "checkpoint (async)",
           "evaluation", "final export", "restart"]


@dataclasses.dataclass
class Case:
    moment: str
    sig: int
    trigger: str  # a console line that starts with this, or "" (a delay after start)
    delay: float  # seconds after the trigger
    env: dict
    extra: list


def plan(n: int, seed: int = 0) -> list[Case]:
    """`n` stops, the moments in turn, SIGINT and SIGTERM alternating."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        moment = MOMENTS[i % len(MOMENTS)]
        sig = (signal.SIGINT, signal.SIGTERM)[(i + i // len(MOMENTS)) % 2]  # both, per moment
        pause = lambda phase, step: {"PHALANX_FAULT":  # noqa: E731
                                     f"rank=0,step={step},phase={phase},action=pause"}
        if moment == "start-up":
            case = Case(moment, sig, "", rng.uniform(0.2, 2.5), {}, [])
        elif moment == "first step":
            case = Case(moment, sig, "step 1/", 0.0, {}, [])
        elif moment == "mid-step":
            case = Case(moment, sig, f"step {rng.randint(2, STEPS - 8)}/",
                        rng.uniform(0, 0.1), {}, [])
        elif moment.startswith("checkpoint"):
            step = rng.choice([8, 16])
            extra = ["--async-checkpoint"] if "async" in moment else []
            case = Case(moment, sig, "phalanx-fault: pause", rng.uniform(0.05, 1.5),
                        pause("checkpoint", step), extra)
        elif moment == "evaluation":
            case = Case(moment, sig, "phalanx-fault: pause", rng.uniform(0.05, 1.5),
                        pause("eval", 12), [])
        elif moment == "final export":
            case = Case(moment, sig, "phalanx-fault: pause", rng.uniform(0.05, 1.5),
                        pause("export", STEPS), [])
        else:  # rank 1 dies after step k (rank 0 then waits in step k: its last line is
            # k - 1); the signal comes while the agent restarts every rank (~3 s)
            k = rng.randint(3, STEPS - 4)
            case = Case(moment, sig, f"step {k - 1}/", rng.uniform(0.2, 2.0),
                        {"PHALANX_FAULT": f"rank=1,step={k},phase=step,action=kill"},
                        ["--max-restarts", "1"])
        cases.append(case)
    return cases


def command(out: Path, corpus: Path, cache: Path, extra=()) -> list[str]:
    return [sys.executable, "-m", "phalanx", "train", *ARGS, "--data", str(corpus),
            "--cache-dir", str(cache), "--out", str(out), *extra]


@dataclasses.dataclass
class Stopped:
    code: int
    stdout: str
    stderr: str
    workers: set
    sent: bool
    before: dict  # committed checkpoint name → verified, when the signal was sent
    last_step: int  # the last "step N/" rank 0 had printed then (0: none)

    @property
    def received(self) -> int | None:
        """The steps rank 0 had done when the signal reached it, as it said at once
        ("phalanx: SIGINT received after step N of M"); None when it never said so."""
        found = RECEIVED.search(self.stdout)
        return None if found is None else int(found.group(1))


def step_of(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def checkpoints(out: Path) -> dict[str, bool]:
    """Each committed checkpoint under OUT/checkpoints → whether it verifies."""
    return {p.name: verify(p) is None for p in committed(out / "checkpoints")}


def _last_step(lines: list[str]) -> int:
    steps = [int(ln.split("/", 1)[0].split()[-1]) for ln in lines
             if ln.startswith("step ") and "/" in ln.split()[1]]
    return max(steps, default=0)


def stop_once(case: Case, out: Path, corpus: Path, cache: Path) -> Stopped:
    """Run until the case's moment, send its signal, wait for the end."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:  # a terminal's Ctrl-C is not
        # ignored; a background job of a non-interactive shell (`cmd &`) inherits SIGINT
        # ignored, and then so would the run (Python leaves an ignored SIGINT ignored): a
        # start-up stop went unheard in 7 of 100 (benchmarks/results/stop_stress_100.txt)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # children: SIG_DFL
    env = {**os.environ, **case.env, "PYTHONUNBUFFERED": "1"}  # lines as they happen
    proc = subprocess.Popen(command(out, corpus, cache, case.extra), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: queue.Queue = queue.Queue()
    texts = {"out": [], "err": []}

    def pump(stream, name):
        for line in stream:
            texts[name].append(line)
            lines.put(line)
        lines.put(None)

    readers = [threading.Thread(target=pump, args=(proc.stdout, "out"), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, "err"), daemon=True)]
    for r in readers:
        r.start()
    sent = _wait_for(case, lines, proc)
    workers = procs.descendants(proc.pid)
    before, last = {}, 0
    if sent:
        time.sleep(case.delay)
        workers |= procs.descendants(proc.pid)  # those of a restart, too
        before, last = checkpoints(out), _last_step(list(texts["out"]))
        if case.sig == signal.SIGINT:
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground group
        else:
            proc.send_signal(signal.SIGTERM)  # e.g. a scheduler stopping the job
    proc.wait(timeout=180)
    workers |= procs.with_argument(str(out))  # any process of this run still there
    for r in readers:
        r.join(timeout=10)
    return Stopped(proc.returncode, "".join(texts["out"]), "".join(texts["err"]), workers, sent,
                   before, last)


def _wait_for(case: Case, lines: queue.Queue, proc: subprocess.Popen) -> bool:
    if not case.trigger:
        return True
    ended = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and ended < 2:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            continue
        if line is None:
            ended += 1
        elif line.startswith(case.trigger):
            return True
    return False
