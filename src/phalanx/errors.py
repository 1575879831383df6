"""Errors that Phalanx raises on purpose.

A `UserError` is a mistake in what the user asked for (a flag, a file, a config key):
the CLI prints its message alone and exits with code 2, without a traceback. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class PhalanxError(Exception):
    """Base class of every error Phalanx raises deliberately."""


class UserError(PhalanxError):
    """Bad input: what was found, what was expected, how to fix it. Exit code 2."""

    exit_code = 2


class DistributedError(PhalanxError):
    """A failure in a running job, naming the rank(s) it happened on."""

    def __init__(self, message: str, ranks: list[int] | None = None) -> None:
        self.ranks = list(ranks or [])
        prefix = f"[rank {', '.join(map(str, self.ranks))}] " if self.ranks else ""
        super().__init__(prefix + message)
