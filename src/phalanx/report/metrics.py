"""`metrics.jsonl`: one JSON object per logged step, appended and flushed as it happens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
