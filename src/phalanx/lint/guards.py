"""Where a statement runs on some ranks only: under a rank-dependent `if`, after an early
`if rank != 0: return` on its path, or inside a function every call site of which (in
this file) is itself rank-guarded. Built once per file (`Context.rank_guards`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from phalanx.lint.syntax import dotted, whether_distributed

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
EXITS = {"exit", "sys.exit", "os._exit", "quit"}


class Context(Protocol):
    """What guards reads of `lint.engine.Context` (named structurally: the engine imports
    this module, not the other way round)."""

    nodes: list[ast.AST]
    parents: dict[ast.AST, ast.AST]
    imported: dict[str, str]
    external: dict[str, list]
    _call_index: dict | None
    _caller_guards: dict | None

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]: ...
    def before(self, node: ast.AST) -> list[ast.stmt]: ...
    def function_of(self, node: ast.AST) -> ast.AST: ...
    def rank_dependent(self, expr: ast.AST) -> bool: ...


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
        return dotted(end.value) in EXITS
    if isinstance(end, (ast.Continue, ast.Break)):
        loop = next((a for a in ctx.ancestors(cond) if isinstance(a, (*LOOPS, *FUNCTIONS))),
                    None)
        return isinstance(loop, LOOPS) and loop in ctx.ancestors(node)
    return False


def _real_rank_test(test: ast.expr) -> bool:
    """A test that lets some ranks past: not "distributed at all?" (`rank is None`,
    `local_rank == -1`), nor a split of work over ranks (`i % world != rank: continue`)."""
    return not whether_distributed(test) and not any(isinstance(n, ast.BinOp)
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
    if ctx._call_index is not None:
        return ctx._call_index
    index: dict[str, dict[str, list[ast.AST]]] = {k: {} for k in ("f", "m", "fref", "mref")}
    for node in ctx.nodes:
        if not isinstance(node, (ast.Name, ast.Attribute)) or \
                not isinstance(node.ctx, ast.Load):
            continue
        parent = ctx.parents.get(node)
        call = parent if isinstance(parent, ast.Call) and parent.func is node else None
        if isinstance(node, ast.Name):
            index["f" if call else "fref"].setdefault(node.id, []).append(call or node)
        elif call is None or dotted(node.value).split(".")[0] not in ctx.imported:
            # (not `module.f()`: another module's f)
            index["m" if call else "mref"].setdefault(node.attr, []).append(call or node)
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


def passed_rank(ctx: Context, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> bool:
    """Every call of `func` in this file (of its class, for `__init__`) passes a rank as
    its parameter `name`: `Trainer(model, data, rank)` for `__init__(self, m, d, gpu_id)`."""
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    owner = ctx.parents.get(func)
    if name not in params:
        return False
    sites: list[ast.Call] | None
    if isinstance(owner, ast.ClassDef) and func.name == "__init__":
        index = _index(ctx)
        sites = None if owner.name in index["fref"] else [
            c for c in index["f"].get(owner.name, []) if isinstance(c, ast.Call)]
    else:
        sites = call_sites(ctx, func)
    position = params.index(name) - (1 if isinstance(owner, ast.ClassDef) else 0)
    return bool(sites) and all(
        (arg := _argument(site, name, position)) is not None and ctx.rank_dependent(arg)
        for site in sites or ())


def _argument(call: ast.Call, name: str, position: int) -> ast.expr | None:
    keyword = next((k.value for k in call.keywords if k.arg == name), None)
    if keyword is not None or not 0 <= position < len(call.args):
        return keyword
    arg = call.args[position]
    return None if isinstance(arg, ast.Starred) else arg


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
