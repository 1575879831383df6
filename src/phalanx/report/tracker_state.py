"""What the experiment trackers keep in the run directory: `OUT/trackers.json` (each
tracker's run id, so a resumed run continues the same tracker run), and the run's
configuration and environment they log as config or params."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from phalanx.paths import RunDir, atomic_write, parse_json

FILE = "trackers.json"
_KEPT = threading.Lock()  # trackers.json is written by the training and MLflow's threads


def params_of(out_dir: Path) -> dict[str, Any]:
    """The run's configuration and environment, as a tracker run's config or params."""
    found = {}
    for name in ("run_config.json", "environment.json"):
        try:
            found[name.removesuffix(".json")] = parse_json((Path(out_dir) / name).read_text())
        except (OSError, ValueError):
            continue
    return found


def kept_state(out_dir: Path, name: str) -> dict[str, Any]:
    """What tracker `name` kept in OUT/trackers.json (its run's id …), or {}."""
    found = _read(out_dir).get(name)
    return found if isinstance(found, dict) else {}


def _read(out_dir: Path) -> dict[str, Any]:
    try:
        found = parse_json((RunDir(out_dir) / FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def keep_state(out_dir: Path, name: str, value: dict[str, Any]) -> None:
    """Keep tracker `name`'s `value` in OUT/trackers.json (atomically, link-safe)."""
    with _KEPT:
        atomic_write(RunDir(out_dir) / FILE, json.dumps({**_read(out_dir), name: value},
                                                        indent=1) + "\n")
