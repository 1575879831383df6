"""The verbs: each module parses its flags, calls one function and returns an exit code.
`phalanx.cli.dispatch` is the table of verbs; `entry` is the console script, which sets up
signal handling before anything heavy is imported (so this package's top stays empty)."""

from __future__ import annotations

from typing import Any

_DISPATCH = ("VERBS", "build_parser", "main", "parse")


def __getattr__(name: str) -> Any:
    if name in _DISPATCH:  # `from phalanx.cli import main`: the table, loaded on first use
        from phalanx.cli import dispatch

        return getattr(dispatch, name)
    raise AttributeError(f"module 'phalanx.cli' has no attribute {name!r}")
