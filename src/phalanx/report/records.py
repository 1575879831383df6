"""What the run report reads from a run directory, checked before it is used: a record
that is not what the report expects (no whole-number `step`, a figure that is not a
number a float can hold, an event whose fields are not text, a line that is not JSON or
nests too deeply) is skipped, and each file with such lines gets one warning naming its
lines. Files are opened without following a symbolic link and only when they are
regular files, so a link or a FIFO planted in the run directory is never read through."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.report.metrics import parse_lines

Warn = Callable[[str], None]

# the figures the report draws and sums; each must be a number when present
FIGURES = ("loss", "val_loss", "val_nats_per_byte", "lr", "tokens_per_s", "step_time_s",
           "grad_norm", "memory_mib", "slowest_rank", "slowest_to_fastest",
           "slowest_to_own_best")
MAX_STEP = 2**63  # steps are counted in int64 everywhere else


def read_text(path: Path, warn: Warn, limit: int = -1) -> str | None:
    """The text of the regular file `path` (its first `limit` bytes when given; None when
    there is none; a link, a directory or an unreadable file is left out with a
    warning)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "is a symbolic link, not followed" if exc.errno == errno.ELOOP else \
            f"cannot be read ({exc.strerror})"
        warn(f"phalanx: warning: `{path}` {why}; the report leaves it out.")
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            warn(f"phalanx: warning: `{path}` is not a regular file; the report leaves it "
                 "out.")
            return None
        return fh.read(limit).decode("utf-8", errors="replace")


def read_object(path: Path, warn: Warn) -> dict[str, Any]:
    """The JSON object in `path` ({} when absent or not one, with a warning)."""
    text = read_text(path, warn)
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        warn(f"phalanx: warning: `{path}` is not a JSON object (or nests too deeply); the "
             "report leaves it out.")
        return {}
    return value


def read_records(path: Path, check: Callable[[dict], str | None], warn: Warn
                 ) -> list[dict[str, Any]]:
    """The JSON-object lines of `path` that `check` passes (it returns why not, or None
    and may normalise the record in place); one warning for all the others."""
    text = read_text(path, warn)
    if text is None:
        return []
    kept: list[dict[str, Any]] = []
    skipped: list[tuple[int, str]] = []
    why: str | None  # parse_lines' reason, then `check`'s
    for number, record, why in parse_lines(text):
        if record is not None:
            why = check(record)
        if why is None:
            assert record is not None  # why is None only from check(record)
            kept.append(record)
        else:
            skipped.append((number, why))
    if skipped:
        warn(skipped_message(path, skipped))
    return kept


def skipped_message(path: Path, skipped: list[tuple[int, str]]) -> str:
    """One line: the file, how many records, which lines, and why (each reason once)."""
    numbers = [str(n) for n, _ in skipped]
    lines = ", ".join(numbers[:10]) + (f" and {len(numbers) - 10} more" if len(numbers) > 10
                                       else "")
    reasons = list(dict.fromkeys(why for _, why in skipped))
    said = "; ".join(reasons[:4]) + ("; …" if len(reasons) > 4 else "")
    plural = "s" if len(skipped) > 1 else ""
    return (f"phalanx: warning: `{path}`: skipped {len(skipped)} record{plural} the report "
            f"cannot use (line{plural} {lines}: {said}); it shows the rest.")


def whole_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_STEP


def as_float(value: Any) -> float | None:
    """`value` as a float when it is a JSON number a float can hold (NaN and ±inf
    included: a run may log them), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def check_metric(record: dict[str, Any]) -> str | None:
    """Why `record` cannot be a metrics record, or None (its figures become floats)."""
    if "step" not in record:
        return "no `step`"
    if not whole_step(record["step"]):
        return "`step` is not a whole number from 0 that fits in 64 bits"
    for key in FIGURES:
        if key in record:
            value = as_float(record[key])
            if value is None:
                return f"`{key}` is not a number a float can hold"
            record[key] = value
    return None


def check_event(record: dict[str, Any]) -> str | None:
    """Why `record` cannot be an event (see report.events), or None."""
    if not whole_step(record.get("step")):
        return "`step` is missing or not a whole number from 0 that fits in 64 bits"
    for key in ("kind", "message"):
        if not isinstance(record.get(key), str):
            return f"`{key}` is missing or not text"
    if not isinstance(record.get("time", ""), str):
        return "`time` is not text"
    return None


def finite(values: list[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]
