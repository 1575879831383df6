"""The call graph across the files of one `phalanx lint` run: which functions, in any of
them, run a collective (directly, hidden, or through other helpers), so that a helper
defined in `utils.py` and called under `if rank == 0:` in `train.py` is judged like a
helper of `train.py` itself. Functions are known by name; a file that cannot contain
a collective (none of their names in its text) is not parsed for this."""

from __future__ import annotations

from pathlib import Path

from phalanx.lint.engine import Context
from phalanx.lint.rules.collectives import COLLECTIVES, DCP_CALLS, WRAPPERS, collective_functions

WORDS = tuple(COLLECTIVES | set(WRAPPERS) | DCP_CALLS) + ("full_tensor", "consolidate_state_dict",
                                                         "dcp", "distributed.checkpoint")


def project_collectives(paths: list[Path], rounds: int = 4) -> dict[str, str]:
    """Function name → the collective it runs, over every file in `paths`."""
    sources = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # reported when the file itself is linted
        if "def " in text and any(word in text for word in WORDS):
            sources[path] = text
    found: dict[str, str] = {}
    contexts = {}
    for path, text in sources.items():
        try:
            contexts[path] = Context(str(path), text)
        except (SyntaxError, ValueError, RecursionError):
            continue
    for _ in range(rounds):  # helpers calling helpers of other files
        before = dict(found)
        for path, ctx in contexts.items():
            ctx.project = {k: v for k, v in before.items()}
            for name, what in collective_functions(ctx).items():
                found.setdefault(name, f"{what} (in {Path(ctx.path).name})"
                                 if "(in " not in what else what)
        if found == before:
            break
    return found
