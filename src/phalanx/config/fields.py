"""Field helpers shared by the config sections: a field's default, help, flag and the
value checks every section runs (no torch: config errors are instant)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field
from typing import Any

from phalanx.errors import UserError


def opt(default: Any, help: str, flag: str | None = None, choices: tuple | None = None,
        metavar: str | None = None) -> Any:
    """A config field: its default, its help text, and optionally flag, choices, metavar."""
    meta = {"help": help, "flag": flag, "choices": choices, "metavar": metavar}
    return field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field) -> str:
    """The command-line spelling of a field: `n_layer` → `--n-layer`."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


INT64 = 1 << 63
MAX_TIMEOUT_S = 30 * 24 * 3600.0  # a collective that may wait a month is a mistake
MAX_PROCS = 4096


def _field(section: Any, name: str) -> dataclasses.Field:
    return {x.name: x for x in dataclasses.fields(section)}[name]


def _check_values(section: Any) -> None:
    """Every number finite and within 64 bits, every given string non-empty: one line
    naming the flag otherwise. Runs first in each section's `__post_init__`."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"`{flag_of(f)}` must be a finite number, got {value}.")
        if isinstance(value, int) and not -INT64 <= value < INT64:
            raise UserError(f"`{flag_of(f)}` {value} does not fit in 64 bits.")
        if isinstance(value, str) and not value.strip():
            raise UserError(f"`{flag_of(f)}` must not be empty; give a value or leave the "
                            f"flag out for its default.")


def _at_most(section: Any, name: str, limit: float, why: str) -> None:
    value = getattr(section, name)
    if value is not None and value > limit:
        raise UserError(f"`{flag_of(_field(section, name))}` {value:g} is more than {limit:g}: "
                        f"{why}.")


def _positive(section: Any, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if value is not None and value <= 0:
            f = _field(section, name)
            raise UserError(f"`{flag_of(f)}` must be a positive number, got {value}.")


def step_range(text: str, flag: str) -> tuple[int, int]:
    """`A-B` (or `A`) → (A, B): 1-based optimizer steps, A <= B; a UserError naming `flag`."""
    first, sep, last = text.partition("-")
    try:
        a, b = int(first), int(last if sep else first)
    except ValueError:
        a = b = 0
    if not 1 <= a <= b:
        raise UserError(f"`{flag} {text}` must be A-B with 1 <= A <= B (optimizer steps, as "
                        f"the progress line counts them), e.g. `{flag} 5-7`.")
    return a, b


TRACKERS = ("wandb", "mlflow")  # the experiment trackers built (report.trackers)


def tracker_list(given: Any) -> tuple[str, ...]:
    """The experiment trackers `given` names (comma-separated text, or names), each known
    and installed; a UserError saying what to do otherwise. None or empty: none."""
    import importlib.util

    if not given:
        return ()
    names = [n.strip().lower() for n in (given.split(",") if isinstance(given, str) else given)]
    for name in (names := list(dict.fromkeys(n for n in names if n))):
        if name not in TRACKERS:
            raise UserError(f"tracker `{name}` is not supported; supported: "
                            f"{', '.join(TRACKERS)} (TensorBoard files are written whenever "
                            f"TensorBoard is installed, metrics.jsonl always).")
        if importlib.util.find_spec(name) is None:
            raise UserError(f"tracker `{name}` needs the {name} package, which is not "
                            f"installed: pip install 'phalanx[trackers]'.")
    return tuple(names)
