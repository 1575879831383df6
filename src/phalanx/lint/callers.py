"""Calls of a linted file's module-level functions from the other linted files, with the
rank guard each call runs under: `save_hf_format` of `utils.py` called only under
`if args.global_rank == 0:` in every `main.py` runs on rank 0 only (`Context.external`,
read by lint.guards.caller_guard). Conservative: a function passed by name, imported
with `*`, or named in a file that could not be analysed has an unknown caller — not a
file that binds the name to a function of another module (`from ckpt_moe import f`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

from phalanx.lint.engine import Context, dotted
from phalanx.lint.guards import Guard

Site = tuple[Guard | None, str]  # (the guard the call runs under, "main.py:389")
UNKNOWN: Site = (None, "")
WORD = re.compile(r"\w+")


def _importers(imports: dict[str, set[str]]) -> dict[str, set[str]]:
    """File → the linted files that import it (lint.project reads the imports)."""
    found: dict[str, set[str]] = {}
    for name, targets in imports.items():
        for target in targets - {name}:
            found.setdefault(target, set()).add(name)
    return found


def _target(ctx: Context, node: ast.AST, suffixes: dict[str, str], file: str) -> str | None:
    """The function of `file` that `node` (a name or `module.name`) names in `ctx`."""
    if isinstance(node, ast.Name) and node.id in ctx.imported:
        module, _, name = ctx.imported[node.id].rpartition(".")
        return name if module and suffixes.get(module) == file else None
    if isinstance(node, ast.Attribute):
        receiver = dotted(node.value)
        root = receiver.split(".")[0]
        if root in ctx.imported:
            module = ctx.imported[root] if receiver == root else receiver
            return node.attr if suffixes.get(module) == file else None
    return None


def _references(ctx: Context) -> list[ast.AST]:
    """The names and attributes `ctx` reads through what it imports (`f`, `utils.f`): the
    only nodes `_target` can match, found once per file (it is asked once per file that
    the file imports)."""
    cache = ctx.memo.setdefault("imported_references", {})
    if "found" not in cache:
        cache["found"] = [n for n in ctx.of(ast.Name, ast.Attribute)
                          if isinstance(n.ctx, ast.Load) and dotted(n).split(".")[0]
                          in ctx.imported]
    return cache["found"]


def _sites(ctx: Context, file: str, suffixes: dict[str, str]) -> dict[str, list[Site]]:
    found: dict[str, list[Site]] = {}
    if any(local == "*" and suffixes.get(o.rpartition(".")[0]) == file
           for local, o in ctx.imported.items()):
        return {"*": [UNKNOWN]}
    for node in _references(ctx):
        name = _target(ctx, node, suffixes, file)
        if name is None:
            continue
        parent = ctx.parents.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            guard = ctx.rank_guard(parent)
            where = f"{Path(ctx.path).name}:{parent.lineno}"
            found.setdefault(name, []).append(
                (Guard(guard.cond, guard.holds, "caller", "", where) if guard else None,
                 where))
        elif not isinstance(parent, ast.Attribute):  # passed by name: called anywhere
            found.setdefault(name, []).append(UNKNOWN)
    return found


def _attributes(ctx: Context) -> set[str]:
    """The attribute names `ctx` uses (`x.name`), found once per file."""
    cache = ctx.memo.setdefault("attribute_names", {})
    if "found" not in cache:
        cache["found"] = {n.attr for n in ctx.of(ast.Attribute)}
    return cache["found"]


def _elsewhere(ctx: Context | None, name: str, file: str) -> bool:
    """In a file that does not import `file`, `name` is another function: one the file
    defines at its top level, or imports from a module that is neither `file` nor a
    package `file` is in (which could re-export it) — and it is never used as an
    attribute (`x.name`: possibly `file`'s, through a module object)."""
    if ctx is None or name in _attributes(ctx):
        return False
    if any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
           and n.name == name for n in ctx.tree.body):
        return name not in ctx.imported
    module = ctx.imported.get(name, "").rpartition(".")[0].split(".")
    if module == [""]:
        return False
    path = Path(file).with_suffix("").parts
    here = path[:-1] if path[-1] == "__init__" else path
    return tuple(module) != here[-len(module):] and tuple(module) != path[-len(module) - 1:-1]


def external_callers(texts: dict[str, str], imports: dict[str, set[str]],
                     suffixes: dict[str, str],
                     contexts: dict[str, Context | None],
                     parse: Callable[[str, str], Context | None]) -> dict[str, dict]:
    """File → function name → its call sites in the other linted files. `contexts` is
    filled with the importers parsed here (the lint reuses them)."""
    result: dict[str, dict[str, list[Site]]] = {}
    words: dict[str, set[str]] = {}  # each file's identifiers, read once when needed
    for file, importers in _importers(imports).items():
        seen: dict[str, list[Site]] = {}
        for other in sorted(importers):
            if other not in contexts:
                contexts[other] = parse(other, texts[other])
            ctx = contexts[other]
            if ctx is None:
                continue  # named in its text: unknown, below
            for name, sites in _sites(ctx, file, suffixes).items():
                seen.setdefault(name, []).extend(sites)
        analysed = {o for o in importers if contexts.get(o) is not None} | {file}
        for f in texts.keys() - analysed if seen else ():
            if f not in words:
                words[f] = set(WORD.findall(texts[f]))
            for name in seen.keys() & words[f]:
                if f not in contexts:
                    contexts[f] = parse(f, texts[f])
                if not _elsewhere(contexts[f], name, file):
                    seen[name].append(UNKNOWN)
        if seen:
            result[file] = seen
    return result
