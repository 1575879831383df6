"""Which files `phalanx lint PATH...` checks.

Every `.py` file under a named directory is checked, whatever the path looks like
(`../project`, a path through a hidden folder, a symlinked folder), except folders and
files whose name matches an exclusion — as ruff does: a short default list of folders
that hold no project source (version control, virtual environments, caches), replaced
with `--exclude` or added to with `--extend-exclude`. Exclusions apply below a named
directory, never to what the user named. A named file is always checked.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

DEFAULT_EXCLUDE = (".git", ".hg", ".svn", ".venv", "venv", ".tox", ".nox", "__pycache__",
                   ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules",
                   "site-packages", "__pypackages__", ".eggs")


def patterns(exclude: str | None, extend: str) -> tuple[str, ...]:
    """The exclusion globs: `--exclude` (replacing the defaults) plus `--extend-exclude`."""
    base = DEFAULT_EXCLUDE if exclude is None else _split(exclude)
    return tuple(base) + _split(extend)


def _split(raw: str) -> tuple[str, ...]:
    return tuple(p.strip().rstrip("/") for p in raw.split(",") if p.strip())


def excluded(name: str, relative: str, globs: Iterable[str]) -> bool:
    """A file or folder is excluded when its name, or its path below the named
    directory, matches a glob."""
    return any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(relative, g) for g in globs)


def python_files(paths: Iterable[str], globs: Iterable[str] = DEFAULT_EXCLUDE
                 ) -> Iterator[Path]:
    """Named files as given; under named directories, every `.py` file not excluded,
    following symlinked folders once each (a link loop is walked once)."""
    globs = tuple(globs)
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            yield from _walk(path, globs)
        else:
            yield path


def _walk(root: Path, globs: tuple[str, ...]) -> Iterator[Path]:
    seen: set[str] = set()
    found: list[Path] = []
    for folder, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:  # a symlink back up the tree, or two links to one folder
            dirs[:] = []
            continue
        seen.add(real)
        below = os.path.relpath(folder, root)
        rel = "" if below == "." else below + os.sep
        dirs[:] = sorted(d for d in dirs if not excluded(d, rel + d, globs))
        found.extend(Path(folder, n) for n in names
                     if n.endswith(".py") and not excluded(n, rel + n, globs))
    return iter(sorted(found))
