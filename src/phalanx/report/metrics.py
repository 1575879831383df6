"""`metrics.jsonl`: one JSON object per logged step, appended and flushed as it happens.

A crash mid-write leaves a torn last line; reading skips it (and any other line that is
not a JSON object), says so once, and a resumed run rewrites the file without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


class MetricsWriter:
    """Starts the file afresh, or appends when `append` (a resumed run)."""

    def __init__(self, path: Path, append: bool = False) -> None:
        self.path = path
        self._fh = open(path, "a" if append else "w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics(path: Path, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The records of a metrics file; unreadable lines (a torn tail) are skipped and,
    with `warn`, reported in one message."""
    records, bad = [], []
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            bad.append(number)
    if bad and warn is not None:
        torn = bad == [len(text.splitlines())] and not text.endswith("\n")
        what = "ends with a torn line (a crash mid-write)" if torn else \
            f"has {len(bad)} unreadable line(s) ({', '.join(map(str, bad[:5]))})"
        warn(f"warning: `{path}` {what}; skipped.")
    return records
