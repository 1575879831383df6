"""The call graph across the files of one `phalanx lint` run: module-level functions that
run a collective (directly, hidden, or through other helpers), so that a helper defined
in `utils.py` and called under `if rank == 0:` in `train.py` is judged like a helper of
`train.py` itself. A file sees another file's functions only through its own imports
(`from utils import f`, `import utils` then `utils.f()`), matched by module name; a file
that cannot contain a collective (none of their names in its text) is not parsed."""

from __future__ import annotations

import ast
from pathlib import Path

from phalanx.lint.engine import Context
from phalanx.lint.rules.collectives import COLLECTIVES, DCP_CALLS, WRAPPERS, collective_functions

WORDS = tuple(COLLECTIVES | set(WRAPPERS) | DCP_CALLS) + ("full_tensor", "consolidate_state_dict",
                                                         "dcp", "distributed.checkpoint")


def _contexts(paths: list[Path]) -> dict[str, Context]:
    """Module name (file stem) → parsed file, for files that may hold a collective."""
    found = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
            if "def " in text and any(word in text for word in WORDS):
                found[path.stem] = Context(str(path), text)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
            continue  # reported when the file itself is linted
    return found


def visible(ctx: Context, modules: dict[str, dict[str, str]]) -> dict[str, str]:
    """What `ctx` imports from the other linted modules: local name → collective."""
    seen: dict[str, str] = {}
    for local, origin in ctx.imported.items():
        module, _, name = origin.rpartition(".")
        stem = module.rpartition(".")[2]
        if stem in modules and name in modules[stem]:  # from utils import f
            seen[local] = modules[stem][name]
        elif origin.rpartition(".")[2] in modules:  # import utils: utils.f()
            for function, what in modules[origin.rpartition(".")[2]].items():
                seen.setdefault(function, what)
    return seen


def project_collectives(paths: list[Path], rounds: int = 4) -> dict[str, dict[str, str]]:
    """Module name → {module-level function → the collective it runs}."""
    contexts = _contexts(paths)
    modules: dict[str, dict[str, str]] = {}
    for _ in range(rounds):  # helpers calling helpers of other modules
        before = {m: dict(f) for m, f in modules.items()}
        for stem, ctx in contexts.items():
            ctx.project = visible(ctx, before)
            top = {n.name for n in ctx.tree.body
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            found = {name: what if "(in " in what else f"{what} (in {stem}.py)"
                     for name, what in collective_functions(ctx).items() if name in top}
            if found:
                modules[stem] = found
        if modules == before:
            break
    return modules
