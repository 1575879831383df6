"""Which assignment of a name reaches a use of it, per scope: the last binding on the use's
path in its function; else (when the name is not a parameter there) the module's
bindings, or for `self.x` the class's. A value of None: bound by something other than a
plain assignment (a loop target, `with ... as`, `x += ...`, an unpacked call result)."""

from __future__ import annotations

import ast
from collections.abc import Sequence

from phalanx.lint.engine import Context, dotted
from phalanx.lint.syntax import children, subtree, walk

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
Binding = tuple[int, ast.expr | None]  # (line, the value bound, if known)


def _bound(target: ast.AST, value: ast.AST | None, name: str) -> tuple[bool, ast.expr | None]:
    """(whether `target = value` binds `name`, the value it binds it to if known)."""
    if dotted(target) == name and isinstance(target, (ast.Name, ast.Attribute)):
        return True, value if isinstance(value, ast.expr) else None
    if isinstance(target, (ast.Tuple, ast.List)):
        values: list = value.elts if isinstance(value, (ast.Tuple, ast.List)) \
            and len(value.elts) == len(target.elts) else [None] * len(target.elts)
        for t, v in zip(target.elts, values):
            binds, bound = _bound(t, v, name)
            if binds:
                return True, bound
    if isinstance(target, ast.Starred):
        return _bound(target.value, None, name)
    return False, None


def _pairs(node: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
    if isinstance(node, ast.Assign):
        return [(t, node.value) for t in node.targets]
    if isinstance(node, (ast.AnnAssign, ast.NamedExpr)):
        return [(node.target, node.value)]
    if isinstance(node, ast.AugAssign):
        return [(node.target, None)]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [(node.target, None)]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [(node.optional_vars, None)]
    return []


def bindings(stmts: Sequence[ast.AST], name: str, cache: dict | None = None
             ) -> list[Binding]:
    """Every binding of `name` inside `stmts` (nested functions and classes excluded).
    `cache` (one per file: `ctx.memo`): each statement's bindings of every name, found in
    one walk of it, not one per name asked (the linter asks about many names)."""
    if cache is None:
        return _all_bindings(stmts).get(name, [])
    found: list[Binding] = []
    for stmt in stmts:
        if stmt not in cache:
            cache[stmt] = _all_bindings([stmt])
        found += cache[stmt].get(name, [])
    return found


def _all_bindings(stmts: Sequence[ast.AST]) -> dict[str, list[Binding]]:
    """`bindings` of every name bound inside `stmts`, in one walk."""
    found: dict[str, list[Binding]] = {}
    todo = list(stmts)
    while todo:
        node = todo.pop()
        if isinstance(node, (*FUNCTIONS, ast.Lambda, ast.ClassDef)):
            continue
        todo.extend(children(node))
        for target, value in _pairs(node):
            line = getattr(node, "lineno", getattr(target, "lineno", 0))
            for name in _names(target):
                binds, bound = _bound(target, value, name)
                if binds:
                    found.setdefault(name, []).append((line, bound))
    return found


def _names(target: ast.AST) -> list[str]:
    """The names an assignment target can bind (`_bound` says which, and to what)."""
    if isinstance(target, (ast.Name, ast.Attribute)):
        return [dotted(target)] if dotted(target) else []
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for t in target.elts for n in _names(t)]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return []


def parameters(scope: ast.AST) -> set[str]:
    if not isinstance(scope, FUNCTIONS):
        return set()
    return {a.arg for a in walk(scope.args) if isinstance(a, ast.arg)}


def reaching(ctx: Context, expr: ast.expr, use: ast.AST) -> tuple[str, list[Binding]]:
    """('local', [the last binding on `use`'s path]) when its function binds the name
    before it; ('param', []) when the name is a parameter not rebound; ('outer', every
    module-level binding, or for `self.x` every binding of it in the class); ('none', [])."""
    name, cache = dotted(expr), ctx.memo.setdefault("bindings", {})
    here = bindings(ctx.before(use), name, cache)
    if here:
        return "local", [max(here, key=lambda b: b[0])]
    scope = ctx.function_of(use)
    if isinstance(expr, ast.Name):
        if name in parameters(scope):
            return "param", []
        outer = bindings(list(ctx.tree.body), name, cache)
    else:
        owner = next((a for a in ctx.ancestors(use) if isinstance(a, ast.ClassDef)), ctx.tree)
        owners = ctx.memo.setdefault("bindings_in", {})
        if owner not in owners:  # (gathered once per class, not once per name asked)
            owners[owner] = _in_functions(owner, cache)
        outer = list(owners[owner].get(name, ()))
    return ("outer", outer) if outer else ("none", [])


def _in_functions(owner: ast.AST, cache: dict) -> dict[str, list[Binding]]:
    """Every name bound in the functions of `owner` (a class, or the module) → its
    bindings, function by function in `ast.walk`'s order."""
    merged: dict[str, list[Binding]] = {}
    for f in subtree(owner):
        if isinstance(f, FUNCTIONS):
            for stmt in f.body:
                if stmt not in cache:
                    cache[stmt] = _all_bindings([stmt])
                for name, found in cache[stmt].items():
                    merged.setdefault(name, []).extend(found)
    return merged


def may_reach(ctx: Context, expr: ast.expr, use: ast.AST) -> tuple[str, list[Binding]]:
    """Like `reaching`, with every binding that may reach `use` on its path, not only the
    last one: going back from `use`, the bindings inside preceding compound statements
    (an `if`'s either branch, a loop's body) until a plain assignment of the name at the
    path's own level, which ends the search."""
    where, found = reaching(ctx, expr, use)
    if where != "local":
        return where, found
    name, may = dotted(expr), []
    for stmt in sorted(ctx.before(use), key=lambda s: s.lineno, reverse=True):
        here = bindings([stmt], name, ctx.memo.setdefault("bindings", {}))
        may += here
        if here and isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            break
    return "local", may
