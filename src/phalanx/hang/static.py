"""The static finding a hang or abort report cites: `phalanx lint`'s PX301, PX303 and
PX302 in the files of the ranks' stacks and the Python files beside them (where their
helpers are), naming the line where the ranks part — the stacks only say where they
met."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from phalanx.hang.stacks import Frame, is_user, short
from phalanx.lint.divergence import citation, parting_findings

NEIGHBOURS = 200  # at most this many files beside the stacks' own are read


def static_citation(stacks: Iterable[Iterable[Frame]]) -> str:
    """`phalanx lint` finds where the ranks part: train.py:48: …' from the user frames
    of `stacks`; '' when lint finds nothing there (or cannot read the files)."""
    files = list(dict.fromkeys(f.file for stack in stacks for f in stack if is_user(f)))
    beside: list[str] = []
    for folder in dict.fromkeys(str(Path(f).parent) for f in files):
        try:
            beside += sorted(str(p) for p in Path(folder).glob("*.py"))[:NEIGHBOURS]
        except OSError:
            continue
    try:
        found = parting_findings(files + beside[:NEIGHBOURS])
    except Exception:  # noqa: BLE001 - a report never fails because of its static part
        return ""
    mine = [f for f in found if f.path in files]  # the stacks' own files, else beside them
    return citation(sorted(mine, key=lambda f: (files.index(f.path), f.line)) or found,
                    short=short)
