"""Where a statement runs on some ranks only: under a rank-dependent `if`, after an early
`if rank != 0: return` on its path, or inside a function every call site of which (in
this file) is itself rank-guarded, or defined where only some ranks get (a closure
after the early exit), or decorated by a decorator that calls it only under a rank test
(`@master_only`). Built once per file (`Context.rank_guards`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from phalanx.lint.libraries import process_decorator
from phalanx.lint.syntax import dotted, last, subtree, walk, whether_distributed

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
EXITS = {"exit", "sys.exit", "os._exit", "quit"}
# Frameworks' decorators that run the function on global rank 0 only (Lightning's,
# mmengine's), when imported: the test they stand for
KNOWN_DECORATORS = {"rank_zero_only": "get_rank() == 0", "master_only": "get_rank() == 0"}


class Context(Protocol):
    """What guards reads of `lint.engine.Context` (named structurally: the engine imports
    this module, not the other way round)."""

    nodes: list[ast.AST]
    parents: dict[ast.AST, ast.AST]
    imported: dict[str, str]
    external: dict[str, list]
    _call_index: dict | None
    memo: dict[str, dict]
    tree: ast.Module

    def of(self, *types: type) -> list: ...
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
    kind: str  # "if" | "return" (an early exit before it) | "caller" | "decorator"
    via: str = ""  # kind "caller": the function whose call sites are all guarded;
    # kind "decorator": the decorator that calls the function only under `cond`
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
        if self.kind == "decorator":
            return f"decorated with `@{self.via}`, which runs it only if `{test}`"
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
                                                      for n in walk(test))


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
    func = ctx.function_of(node)
    if isinstance(func, FUNCTIONS):
        found += definition_guards(ctx, func)
    return found


def definition_guards(ctx: Context, func: ast.FunctionDef | ast.AsyncFunctionDef
                      ) -> list[Guard]:
    """The rank conditions every run of `func` is under, from its definition: the guards
    of its `def` statement (a closure defined after `if rank != 0: return` exists on rank
    0 only), and a decorator that calls it only under a rank test (cached)."""
    memo = ctx.memo.setdefault("definition_guards", {})
    if func not in memo:
        memo[func] = []  # (a decorator decorating itself: no loop)
        memo[func] = _decorator_guards(ctx, func) + own_guards(ctx, func)
    return memo[func]


def _decorator_guards(ctx: Context, func: ast.FunctionDef | ast.AsyncFunctionDef
                      ) -> list[Guard]:
    """`@master_only` defined in this file, whose wrapper calls the function only under a
    rank test; one of another linted file (`ctx.memo["decorators"]`, lint.project); or a
    framework's rank-zero decorator, imported (KNOWN_DECORATORS)."""
    found = []
    for decorator in func.decorator_list:
        name = dotted(decorator)
        local = next((f for f in ctx.tree.body if isinstance(f, FUNCTIONS)
                      and f.name == name and f is not func), None)
        if local is not None:
            guard = _wrapper_guard(ctx, local)
            found += [Guard(guard.cond, guard.holds, "decorator", name)] if guard else []
            continue
        test = ctx.memo.get("decorators", {}).get(name)
        root = name.split(".")[0]
        origin = ctx.imported.get(root, "") if "." in name else ctx.imported.get(name, "")
        if test is None and origin and last(name if "." in name else origin) in KNOWN_DECORATORS:
            test = KNOWN_DECORATORS[last(name if "." in name else origin)]
        test = test or process_decorator(ctx, decorator)  # `@accelerator.on_main_process`
        if test is not None:
            cond = ast.parse(f"if {test}:\n    pass").body[0]
            assert isinstance(cond, ast.If)
            found.append(Guard(ast.copy_location(cond, decorator), True, "decorator", name))
    return found


def rank_decorators(ctx: Context) -> dict[str, str]:
    """This file's module-level decorators that call their function only under a rank
    test → that test (as source: the condition the decorated function runs under)."""
    found = {}
    for func in ctx.tree.body:
        if isinstance(func, FUNCTIONS) and func.args.args and \
                (guard := _wrapper_guard(ctx, func)) is not None:
            test = ast.unparse(guard.test)
            found[func.name] = test if guard.holds else f"not ({test})"
    return found


def _wrapper_guard(ctx: Context, decorator: ast.FunctionDef | ast.AsyncFunctionDef
                   ) -> Guard | None:
    """The guard every call of a decorator's function parameter runs under (its first)."""
    params = decorator.args.posonlyargs + decorator.args.args
    if not params:
        return None
    calls = [c for c in subtree(decorator) if isinstance(c, ast.Call)
             and isinstance(c.func, ast.Name) and c.func.id == params[0].arg]
    guards = [next(iter(own_guards(ctx, c)), None) for c in calls]
    return guards[0] if guards and all(guards) else None


def _index(ctx: Context) -> dict[str, dict[str, list[ast.AST]]]:
    """Calls and other loads of every name and attribute, in one pass (cached)."""
    if ctx._call_index is not None:
        return ctx._call_index
    index: dict[str, dict[str, list[ast.AST]]] = {k: {} for k in ("f", "m", "fref", "mref")}
    for node in ctx.of(ast.Name, ast.Attribute):
        if not isinstance(node.ctx, ast.Load):
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
        (arg := argument(site, name, position)) is not None and ctx.rank_dependent(arg)
        for site in sites or ())


def argument(call: ast.Call, name: str, position: int) -> ast.expr | None:
    keyword = next((k.value for k in call.keywords if k.arg == name), None)
    if keyword is not None or not 0 <= position < len(call.args):
        return keyword
    arg = call.args[position]
    return None if isinstance(arg, ast.Starred) else arg


def caller_guard(ctx: Context, func: ast.AST) -> Guard | None:
    """A guard shared by all the calls of `func` — in this file, and for a module-level
    function in the other linted files (`ctx.external`) — each call guarded by its own
    condition or by its function's callers (cached). Worked out on demand, for `func` and
    the functions its unguarded calls sit in, transitively; not for the whole file."""
    memo = ctx.memo.setdefault("caller_guard", {})
    if func not in memo:
        if not isinstance(func, FUNCTIONS):
            return None
        _settle(ctx, func, memo)
    return memo[func]


def _settle(ctx: Context, func: ast.FunctionDef | ast.AsyncFunctionDef,
            memo: dict[ast.AST, Guard | None]) -> None:
    """The least fixed point (a cycle of unguarded calls has no guard) over `func` and
    the functions its answer depends on, into `memo`. Iterative, not recursive: a chain
    of callers may be thousands long."""
    own = ctx.memo.setdefault("own_guard", {})  # each call's nearest own guard
    sites: dict[ast.AST, list[ast.Call] | None] = {}  # the functions to settle
    caller: dict[ast.Call, ast.AST] = {}  # each of their calls' own function
    todo: list[ast.AST] = [func]
    while todo:
        f = todo.pop()
        if f in sites or f in memo:
            continue
        sites[f] = call_sites(ctx, f)  # type: ignore[arg-type]
        for call in sites[f] or ():
            if call not in own:
                own[call] = next(iter(own_guards(ctx, call)), None)
            caller[call] = ctx.function_of(call)
            if own[call] is None and isinstance(caller[call], FUNCTIONS):
                todo.append(caller[call])
    found: dict[ast.AST, Guard] = {}
    changed = True
    while changed:  # (callers first: they were found last; a chain settles in one round)
        changed = False
        for f, calls in reversed(sites.items()):
            if f in found:
                continue
            guard = _shared_guard(ctx, f, calls, [  # type: ignore[arg-type]
                own[c] or (found.get(caller[c]) if caller[c] in sites else memo.get(caller[c]))
                for c in calls or ()])
            if guard is not None:
                found[f], changed = guard, True
    memo.update((f, found.get(f)) for f in sites)


def _shared_guard(ctx: Context, func: ast.FunctionDef | ast.AsyncFunctionDef,
                  calls: list[ast.Call] | None, guarded: list[Guard | None]) -> Guard | None:
    """The guard of `func` when each of its `calls` is `guarded` and each call from the
    other files too: the first one's; None when one is not or it escapes."""
    outside = ctx.external.get(func.name, []) + ctx.external.get("*", []) \
        if isinstance(ctx.parents.get(func), ast.Module) else []
    if calls is None or not (calls or outside):
        return None
    guards = guarded + [guard for guard, _ in outside]
    if not all(g is not None for g in guards):
        return None
    first = guards[0]
    assert first is not None
    return Guard(first.cond, first.holds, "caller", func.name, first.where)


def forget_caller_guards(ctx: Context, decorators: bool = False) -> None:
    """Drop the cached guards that depend on what the file sees of the others: its
    callers' (`ctx.external`), and with `decorators` its decorators' too."""
    for name in ("caller_guard", "own_guard") + (("definition_guards",) if decorators else ()):
        ctx.memo.pop(name, None)


def all_guards(ctx: Context, node: ast.AST, callers: bool = True) -> list[Guard]:
    """Every rank guard of `node`, nearest first: its own, then its callers'."""
    found = own_guards(ctx, node)
    if callers:
        outer = caller_guard(ctx, ctx.function_of(node))
        if outer is not None:
            found.append(outer)
    return found
