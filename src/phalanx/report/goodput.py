"""Goodput: the share of a run's wall time that was productive — time inside optimizer
steps that were taken and never taken again — against the time lost to start-up,
restarts, recomputed steps, checkpoints, evaluation, logging and (torchft) quorum waits
and heals: Meta's "effective training time ratio", for every `phalanx train` run.

Rank 0 keeps `OUT/goodput.jsonl`, history as `events.jsonl` is (a resumed run appends).
It writes one record per segment start, one per logged step, one per checkpoint saved
and one at the end, never one per step:

- `start`: a segment began at `step` — a process start (`launched`: when its launcher
  started) or a rollback to a checkpoint (`launched` absent);
- `at` / `saved` / `end`: `step` reached, with `busy` — the seconds spent inside
  optimizer steps since the segment's start — and the wall `time`.

`summarise` reads them: a segment's productive time is its `busy` at the step the next
segment started from (the steps after it were taken again: recomputed); the last
segment's, at its last record. Its wall time runs from its launch (or start) to its last
record; the time a crashed segment ran after its last record is not known and not
counted (at most `--log-every` steps)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.cluster.startup_trace import process_started
from phalanx.paths import RunDir, open_append
from phalanx.report.records import read_records

FILE = "goodput.jsonl"


class Ledger:
    """Rank 0's writer of OUT/goodput.jsonl (every method is a no-op elsewhere)."""

    def __init__(self, out_dir: RunDir | Path | None, writes: bool) -> None:
        self.path = RunDir(out_dir) / FILE if out_dir is not None and writes else None
        self.busy = 0.0

    def start(self, step: int, launched: bool = True) -> None:
        """A segment begins at `step`: this process's start (`launched`), or a rollback."""
        self.busy = 0.0
        record: dict[str, Any] = {"kind": "start", "step": step, "time": time.time()}
        if launched and self.path is not None:  # when this attempt was launched: its
            # launcher's start (the worker's parent), or — restarted by that launcher's
            # agent — when the attempt before it last wrote (the time since is this one's)
            record["launched"] = max(process_started(os.getppid()), _last_time(self.path))
        self._write(record)

    def stepped(self, seconds: float) -> None:
        self.busy += seconds

    def reached(self, step: int, kind: str = "at") -> None:
        """`at` (a logged step), `saved` (a checkpoint of `step`) or `end`."""
        self._write({"kind": kind, "step": step, "busy": round(self.busy, 4),
                     "time": time.time()})

    def _write(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        with os.fdopen(open_append(self.path), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")


def _last_time(path: Path) -> float:
    """The `time` of the ledger's last whole record (0 when there is none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4096))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return 0.0
    for line in reversed(lines):
        try:
            when = json.loads(line).get("time")
        except (ValueError, AttributeError):
            continue
        if isinstance(when, (int, float)):
            return float(when)
    return 0.0


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    productive_s: float
    startup_s: float  # from each launch to its first step
    recomputed_s: float  # steps taken again after a restart or a rollback
    segments: int

    @property
    def share(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        other = self.wall_s - self.productive_s - self.startup_s - self.recomputed_s
        return (f"goodput {self.share:.0%}: {self.productive_s:.1f} s of {self.wall_s:.1f} s "
                f"wall inside optimizer steps kept; lost: start-up {self.startup_s:.1f} s, "
                f"recomputed steps {self.recomputed_s:.1f} s, checkpoints, evaluation, "
                f"logging and waits {max(other, 0.0):.1f} s ({self.segments} segment"
                f"{'s' if self.segments != 1 else ''})")


def summarise(out_dir: RunDir | Path, warn: Callable[[str], None] | None = None
              ) -> Goodput | None:
    """The run's goodput from OUT/goodput.jsonl (None: no segment recorded); lines that
    are not a record are skipped, said in one line to `warn`."""
    path = RunDir(out_dir) / FILE
    if not path.is_file():
        return None
    segments: list[list[dict[str, Any]]] = []
    for record in read_records(path, _check, warn or (lambda line: None)):
        if record["kind"] == "start":
            segments.append([record])
        elif segments:
            segments[-1].append(record)
    if not segments:
        return None
    wall = productive = startup = recomputed = 0.0
    for i, seg in enumerate(segments):
        head, rest = seg[0], seg[1:]
        began = head.get("launched", head["time"])
        wall += (rest[-1]["time"] if rest else head["time"]) - began
        startup += head["time"] - began
        busy = rest[-1]["busy"] if rest else 0.0
        kept = busy
        if i + 1 < len(segments):  # the next one started from this step
            resumed = segments[i + 1][0]["step"]
            kept = max((r["busy"] for r in rest if r["step"] <= resumed), default=0.0) \
                if resumed > head["step"] else 0.0
        productive += kept
        recomputed += busy - kept
    return Goodput(wall, productive, startup, recomputed, len(segments))


def _check(record: dict) -> str | None:
    """Why `record` is not a ledger record (None: it is)."""
    if record.get("kind") not in ("start", "at", "saved", "end"):
        return "no known `kind`"
    if not isinstance(record.get("step"), int) or \
            not isinstance(record.get("time"), (int, float)):
        return "no integer `step` or numeric `time`"
    if record["kind"] != "start" and not isinstance(record.get("busy"), (int, float)):
        return "no numeric `busy`"
    return None
