"""`metrics.jsonl`: one JSON object per logged step, appended and flushed as it happens.

A crash mid-write leaves a torn last line; reading skips it (and any other line that is
not a JSON object), says so once, and a resumed run rewrites the file without it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.paths import open_append


class MetricsWriter:
    """Starts the file afresh, or appends when `append` (a resumed run); a link planted
    at its name is refused in one line (`paths.link_error`), never written through."""

    def __init__(self, path: Path, append: bool = False) -> None:
        self.path = path
        self._fh = os.fdopen(open_append(path, fresh=not append), "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_metrics(path: Path, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The records of a metrics file; unreadable lines (a torn tail) are skipped and,
    with `warn`, reported in one message."""
    text = Path(path).read_bytes().decode("utf-8", errors="replace")
    lines = parse_lines(text)
    records = [record for _, record, _ in lines if record is not None]
    bad = [number for number, record, _ in lines if record is None]
    if bad and warn is not None:
        torn = bad == [len(text.splitlines())] and not text.endswith("\n")
        what = "ends with a torn line (a crash mid-write)" if torn else \
            f"has {len(bad)} unreadable line(s) ({', '.join(map(str, bad[:5]))})"
        warn(f"warning: `{path}` {what}; skipped.")
    return records


def parse_lines(text: str) -> list[tuple[int, dict[str, Any] | None, str]]:
    """(line number, the line's JSON object or None, why not) for each non-blank line."""
    lines = text.splitlines()
    out: list[tuple[int, dict[str, Any] | None, str]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record, why = json.loads(line), "not a JSON object"
        except RecursionError:  # e.g. 100000 nested lists: json recurses once per level
            record, why = None, "nested too deeply"
        except ValueError:
            torn = number == len(lines) and not text.endswith("\n")
            record, why = None, "torn (a crash mid-write)" if torn else "not valid JSON"
        out.append((number, record, why) if isinstance(record, dict) else (number, None, why))
    return out
