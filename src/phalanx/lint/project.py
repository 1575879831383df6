"""The call graph across the files of one `phalanx lint` run: module-level functions that
run a collective (directly, hidden, or through other helpers), so that a helper defined
in `utils.py` and called under `if rank == 0:` in `train.py` is judged like a helper of
`train.py` itself. A file sees another file's functions only through its own imports
(`from utils import f`, `import utils` then `utils.f()`), matched by module name. A file
that mentions neither torch.distributed nor a wrapper and imports no other linted module
cannot define such a function and is not parsed for this."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from phalanx.lint.engine import Context
from phalanx.lint.rules.collectives import collective_functions

WORDS = ("distributed", "dist.", "DDP", "FSDP", "fully_shard", "full_tensor",
         "consolidate_state_dict", "dcp", "accelerator", "fabric")  # where a collective can be
IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))", re.M)


def _may_hold(text: str, stems: set[str]) -> bool:
    """Whether a file can define a function that runs a collective: it mentions
    torch.distributed or a wrapper, or imports another linted module (a helper's helper)."""
    if "def " not in text:
        return False
    if any(word in text for word in WORDS):
        return True
    return any((a or b).rpartition(".")[2] in stems for a, b in IMPORT.findall(text))


def _contexts(paths: list[Path]) -> dict[str, Context]:
    """Module name (file stem) → parsed file, for files that may hold a collective."""
    stems = {p.stem for p in paths}
    found = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
            if _may_hold(text, stems):
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
