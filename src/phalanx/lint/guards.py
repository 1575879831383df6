"""Where a statement runs on some ranks only: under a rank-dependent `if`, after an early
`if rank != 0: return` on its path, or inside a function every call site of which (in
this file) is itself rank-guarded. Built once per file (`Context.rank_guards`)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phalanx.lint.engine import Context

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
EXITS = {"exit", "sys.exit", "os._exit", "quit"}


@dataclass(frozen=True)
class Guard:
    """A rank condition `node` runs under. `holds`: `node` runs when `test` is true (the
    `if`'s body) or when it is false (its `else`, or the code after an early exit)."""

    cond: ast.If | ast.IfExp
    holds: bool
    kind: str  # "if" | "return" (an early exit before it) | "caller"
    via: str = ""  # kind "caller": the function whose call sites are all guarded
    where: str = ""  # kind "caller", a call from another file: "main.py:389"

    @property
    def test(self) -> ast.expr:
        return self.cond.test

    @property
    def line(self) -> int:
        return self.cond.lineno

    def describe(self) -> str:
        """`under `if rank == 0:` at line 5`, `after `if rank != 0: return` at line 5`."""
        test = ast.unparse(self.test)
        if self.kind == "return":
            return f"after `if {test}: return` at line {self.line}"
        where = f"under `if {test}:` at " + (self.where or f"line {self.line}")
        return f"in `{self.via}()`, called only {where}" if self.kind == "caller" else where


def _exits(block: list[ast.stmt], cond: ast.If, node: ast.AST, ctx: Context) -> bool:
    """`block` ends by leaving the code `node` is in: return/exit(), or a
    continue/break of the loop `node` is in."""
    if not block:
        return False
    end = block[-1]
    if isinstance(end, ast.Return):  # not `raise`: a rank that fails ends the job
        return True
    if isinstance(end, ast.Expr) and isinstance(end.value, ast.Call):
        from phalanx.lint.engine import dotted
        return dotted(end.value) in EXITS
    if isinstance(end, (ast.Continue, ast.Break)):
        loop = next((a for a in ctx.ancestors(cond) if isinstance(a, (*LOOPS, *FUNCTIONS))),
                    None)
        return isinstance(loop, LOOPS) and loop in ctx.ancestors(node)
    return False


def _real_rank_test(test: ast.expr) -> bool:
    """A test that lets some ranks past: not "distributed at all?" (`rank is None`,
    `local_rank == -1`), nor a split of work over ranks (`i % world != rank: continue`)."""
    from phalanx.lint.engine import _whether_distributed
    return not _whether_distributed(test) and not any(isinstance(n, ast.BinOp)
                                                      for n in ast.walk(test))


def own_guards(ctx: Context, node: ast.AST) -> list[Guard]:
    """The rank conditions of `node`'s own function: enclosing ifs (nearest first), then
    early exits on its path."""
    found: list[Guard] = []
    child = node
    for parent in ctx.ancestors(node):
        if isinstance(parent, FUNCTIONS):
            break
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test \
                and ctx.rank_dependent(parent.test):
            body = parent.body if isinstance(parent, ast.If) else [parent.body]
            found.append(Guard(parent, child in body, "if"))
        child = parent
    for stmt in reversed(ctx.before(node)):
        if isinstance(stmt, ast.If) and ctx.rank_dependent(stmt.test) \
                and _real_rank_test(stmt.test):
            if _exits(stmt.body, stmt, node, ctx):
                found.append(Guard(stmt, False, "return"))
            elif _exits(stmt.orelse, stmt, node, ctx):
                found.append(Guard(stmt, True, "return"))
    return found


def _index(ctx: Context) -> dict[str, dict[str, list[ast.AST]]]:
    """Calls and other loads of every name and attribute, in one pass (cached)."""
    from phalanx.lint.engine import dotted

    if ctx._call_index is not None:
        return ctx._call_index
    index: dict[str, dict[str, list[ast.AST]]] = {k: {} for k in ("f", "m", "fref", "mref")}
    for node in ctx.nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            parent = ctx.parents.get(node)
            called = isinstance(parent, ast.Call) and parent.func is node
            index["f" if called else "fref"].setdefault(node.id, []).append(
                parent if called else node)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            parent = ctx.parents.get(node)
            called = isinstance(parent, ast.Call) and parent.func is node
            if called and dotted(node.value).split(".")[0] in ctx.imported:
                continue  # `module.f()`: another module's f
            index["m" if called else "mref"].setdefault(node.attr, []).append(
                parent if called else node)
    ctx._call_index = index
    return index


def call_sites(ctx: Context, func: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call] | None:
    """The calls of `func` in this file; None when it escapes (passed by name: a callback,
    `mp.spawn(main)`) and so may be called from anywhere."""
    index = _index(ctx)
    method = isinstance(ctx.parents.get(func), ast.ClassDef)
    calls, refs = (index["m"], index["mref"]) if method else (index["f"], index["fref"])
    if func.name in refs:
        return None
    return [c for c in calls.get(func.name, []) if isinstance(c, ast.Call)]


def caller_guards(ctx: Context) -> dict[ast.AST, Guard]:
    """Function → a guard shared by all its calls — in this file, and for a module-level
    function in the other linted files (`ctx.external`) — each call guarded by its own
    condition or by its function's callers (a fixed point: no recursion)."""
    if ctx._caller_guards is not None:
        return ctx._caller_guards
    funcs = [n for n in ctx.nodes if isinstance(n, FUNCTIONS)]
    sites = {f: call_sites(ctx, f) for f in funcs}
    outside = {f: ctx.external.get(f.name, []) + ctx.external.get("*", [])
               if isinstance(ctx.parents.get(f), ast.Module) else [] for f in funcs}
    own: dict[ast.AST, Guard | None] = {}
    result: dict[ast.AST, Guard] = {}
    changed = True
    while changed:
        changed = False
        for f in funcs:
            calls = sites[f]
            if f in result or calls is None or not (calls or outside[f]):
                continue
            guards: list[Guard | None] = []
            for call in calls:
                if call not in own:
                    own[call] = next(iter(own_guards(ctx, call)), None)
                guards.append(own[call] or result.get(ctx.function_of(call)))
            guards += [guard for guard, _ in outside[f]]
            if all(g is not None for g in guards):
                first = guards[0]
                assert first is not None
                result[f] = Guard(first.cond, first.holds, "caller", f.name, first.where)
                changed = True
    ctx._caller_guards = result
    return result


def all_guards(ctx: Context, node: ast.AST, callers: bool = True) -> list[Guard]:
    """Every rank guard of `node`, nearest first: its own, then its callers'."""
    found = own_guards(ctx, node)
    if callers:
        outer = caller_guards(ctx).get(ctx.function_of(node))
        if outer is not None:
            found.append(outer)
    return found
