"""`OUT/events.jsonl`: what happened to a run besides its metrics — restarts, steps the NaN
guard skipped or rolled back, loss spikes, slow ranks, and (`phalanx run`) when the run
started, ended, failed or was stopped — one JSON object per event, written by one process
(rank 0, or `phalanx run`'s launcher) and shown in the run report. Events are history: a
resumed run appends to them and never drops any."""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.paths import RunDir, open_append
from phalanx.report.records import check_event, read_records

# `phalanx run`'s launcher records these: the run began, or ended in one of three ways
LIFECYCLE = ("start", "end", "failure", "stop")

# torchft (phalanx.ft): the live replica groups changed; this group was healed from a peer
FAULT_TOLERANCE = ("membership", "heal")

# PHALANX_FAULT was set: injected faults act on this start (phalanx.cluster.faults)
KINDS = ("restart", "nan", "rollback", "spike", "straggler", "fault", *LIFECYCLE,
         *FAULT_TOLERANCE, "goodput")  # (goodput: the run's, when a process ends training)

FILE = RunDir("").events.name


def record_event(out_dir: RunDir | Path | None, kind: str, step: int, message: str,
                 when: float | None = None) -> None:
    """Append one event (rank 0 calls it; nothing without a run directory), at the time
    `when` (seconds since the epoch; default: now)."""
    if out_dir is None:
        return
    if kind not in KINDS:
        raise ValueError(f"event kind {kind!r}: expected one of {', '.join(KINDS)}")
    line = {"step": int(step), "kind": kind, "message": message,
            "time": datetime.datetime.fromtimestamp(time.time() if when is None else when)
            .isoformat(timespec="seconds")}
    # a link planted at events.jsonl: refused in one line, never appended through
    with os.fdopen(open_append(RunDir(out_dir).events), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def warn(run, out_dir: RunDir | Path | None, kind: str, step: int, text: str) -> None:
    """Say `text` as a warning on rank 0 and record it as an event of the run."""
    run.print(f"phalanx: warning: {text}")
    if run.is_main:
        record_event(out_dir, kind, step, text)


def read_events(out_dir: RunDir | Path, warn: Callable[[str], None] | None = None
                ) -> list[dict[str, Any]]:
    """The run's events: lines that are not an event as `record_event` writes it (a torn
    last one, a `time` that is not text, ...) are skipped, said in one line to `warn`."""

    return read_records(RunDir(out_dir).events, check_event, warn or (lambda _: None))
