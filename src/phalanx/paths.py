"""What a path the user named is, said in words, so that only regular files are read.

A FIFO read blocks forever, `/dev/zero` never ends, a directory is not a file: each is
refused before it is opened, with a message that says what was found.
"""

from __future__ import annotations

import stat
from pathlib import Path

from phalanx.errors import UserError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"))


def kind(path: Path) -> str:
    """`a directory`, `a FIFO (named pipe)`, …, or `missing` (a dangling link too)."""
    try:
        mode = Path(path).stat().st_mode
    except (OSError, ValueError):
        return "missing"
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def require_file(path: str | Path, what: str, hint: str) -> Path:
    """`path` as a Path if it is a regular file; else a UserError naming what it is."""
    p = Path(path).expanduser()
    found = kind(p)
    if found == "a regular file":
        return p
    if found == "missing":
        raise UserError(f"{what} `{path}` does not exist. {hint}")
    raise UserError(f"{what} `{path}` is {found}, not a regular file. {hint}")
