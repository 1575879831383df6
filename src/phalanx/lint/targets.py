"""Whether what a `torch.save` writes to is the process's own, not one file shared by
every rank: a rank-named path (`f"ckpt_{rank}.pt"`, a function of this file returning one:
`f"{name}.{rankstr()}.pth"`), memory (`io.BytesIO()`), a temporary file or directory
(`tempfile.TemporaryDirectory()`, `mkdtemp()`, `NamedTemporaryFile()`: each process makes
its own), or anything built from one of those: a name bound to it, a file handle opened
on it (`with open(path, "wb") as f`, `fs.open(...)`), a path joined under it — and a
parameter that every call of its function in this file gives such a value, or makes
under a rank guard (`save(dir, f"rank{rank}.pt")`, `if rank == 0: save(dir, "a.pt")`)."""

from __future__ import annotations

import ast

from phalanx.lint.bindings import may_reach, parameters
from phalanx.lint.engine import Context, dotted, last
from phalanx.lint.guards import argument, call_sites
from phalanx.lint.syntax import walk

PRIVATE = {"BytesIO", "StringIO", "TemporaryDirectory", "mkdtemp", "NamedTemporaryFile",
           "TemporaryFile", "SpooledTemporaryFile", "mkstemp"}
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
DEPTH = 5  # names followed back through their bindings, parameters through their calls


def own_target(ctx: Context, expr: ast.AST, at: ast.AST, depth: int = DEPTH) -> bool:
    """`expr`, evaluated at `at`, names a file (or buffer) of this process alone."""
    if depth <= 0:
        return False
    if ctx.rank_dependent(expr):
        return True
    for node in walk(expr):
        if isinstance(node, ast.Call) and (last(dotted(node)) in PRIVATE
                                           or rank_path_function(ctx, node)):
            return True
    return any(_bound_own(ctx, node, at, depth - 1) for node in _names(ctx, expr))


def _names(ctx: Context, expr: ast.AST) -> list[ast.expr]:
    """The names and attributes `expr` reads as values (not a call's callable)."""
    found: list[ast.expr] = []
    for node in walk(expr):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            parent = ctx.parents.get(node)
            if not (isinstance(parent, ast.Call) and parent.func is node):
                found.append(node)
    return found


def _bound_own(ctx: Context, node: ast.expr, at: ast.AST, depth: int) -> bool:
    """The name `node` holds a value of this process's own at `at`: bound by an
    enclosing `with X as name`, or by an assignment reaching `at`, or a parameter."""
    name = dotted(node)
    for parent in ctx.ancestors(at):
        if isinstance(parent, FUNCTIONS):
            break
        if isinstance(parent, (ast.With, ast.AsyncWith)):
            for item in parent.items:
                if item.optional_vars is not None and dotted(item.optional_vars) == name:
                    return own_target(ctx, item.context_expr, item.context_expr, depth)
    where, found = may_reach(ctx, node, at)
    if where == "param":
        return _passed_own(ctx, ctx.function_of(at), name, depth)
    return any(value is not None and own_target(ctx, value, value, depth)
               for _, value in found)


def _passed_own(ctx: Context, func: ast.AST, name: str, depth: int) -> bool:
    """Every call of `func` in the linted files passes its parameter `name` a value of the
    caller's own, or runs under a rank guard (a call from another file only the latter)."""
    if not isinstance(func, FUNCTIONS) or name not in parameters(func):
        return False
    sites = call_sites(ctx, func)
    module_level = isinstance(ctx.parents.get(func), ast.Module)
    outside = ctx.external.get(func.name, []) + ctx.external.get("*", []) \
        if module_level else []
    if not sites or any(guard is None for guard, _ in outside):
        return False
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    method = isinstance(ctx.parents.get(func), ast.ClassDef)
    position = params.index(name) - method if name in params else -1  # -1: keyword-only
    for site in sites:
        if ctx.rank_guard(site) is not None:
            continue
        value = argument(site, name, position)
        if value is None or not own_target(ctx, value, site, depth):
            return False
    return True


def rank_path_function(ctx: Context, value: ast.AST) -> bool:
    """`value` calls a function of this file (`f()`, or `self.f()` of its class) that
    returns an expression reading the rank."""
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    owner: ast.AST | None = None
    if isinstance(func, ast.Name):
        owner, name = ctx.tree, func.id
    elif isinstance(func, ast.Attribute) and dotted(func.value) in ("self", "cls"):
        owner = next((a for a in ctx.ancestors(value) if isinstance(a, ast.ClassDef)), None)
        name = func.attr
    return owner is not None and any(
        isinstance(f, FUNCTIONS) and f.name == name
        and any(isinstance(r, ast.Return) and r.value is not None
                and ctx.rank_dependent(r.value) for r in walk(f))
        for f in getattr(owner, "body", []))
