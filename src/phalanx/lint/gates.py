"""Collectives a helper runs only under a test of its own parameters: `def save(state,
path, synchronize=True): if synchronize: dist.barrier() ...` runs no barrier when called
as `save(..., synchronize=False)`. A `Gate` records, for each call of a helper that runs a
collective, the tests of the helper's parameters it runs under (enclosing `if`s, early
`if not p: return`); a call site binds its constant arguments (by keyword, by position,
else the parameter's constant default) and is `closed` when those constants make every
such call unreachable. Anything not a constant stays unknown, and unknown never closes."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from phalanx.lint.syntax import subtree, walk

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
UNKNOWN: Any = object()
Condition = tuple[ast.expr, bool]  # (a test of the parameters, the truth it must have)
COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.Is: lambda a, b: type(a) is type(b) and a == b,
    ast.IsNot: lambda a, b: not (type(a) is type(b) and a == b)}


class Context(Protocol):
    parents: dict[ast.AST, ast.AST]

    def before(self, node: ast.AST) -> list[ast.stmt]: ...


@dataclass(frozen=True)
class Gate:
    """How a helper's collectives depend on its parameters."""

    positional: tuple[str, ...]  # its positional parameters, in order
    receiver: str  # a method's first parameter: "self" (a method), "cls" (a classmethod)
    defaults: tuple[tuple[str, ast.expr], ...]  # parameter → its default value
    paths: tuple[tuple[Condition, ...], ...]  # per collective: the tests it runs under

    def closed(self, call: ast.Call) -> bool:
        """The call's constant arguments rule out every collective of the helper."""
        env = self.bind(call)
        return bool(env) and all(any(_is(evaluate(test, env), not holds)
                                     for test, holds in path) for path in self.paths)

    def bind(self, call: ast.Call) -> dict[str, Any]:
        """Parameter → the constant the call gives it (or its constant default)."""
        skip = 0
        if self.receiver and isinstance(call.func, ast.Attribute):  # not `C.f(obj, ...)`
            bound = isinstance(call.func.value, ast.Name) and call.func.value.id in ("self", "cls")
            skip = 1 if bound or self.receiver == "cls" else 0
        names = list(self.positional[skip:])
        env: dict[str, Any] = {}
        given: set[str] = set()
        starred = False
        for name, arg in zip(names, call.args):
            if isinstance(arg, ast.Starred):
                starred = True
                break
            given.add(name)
            if isinstance(arg, ast.Constant):
                env[name] = arg.value
        splat = any(k.arg is None for k in call.keywords)
        for k in call.keywords:
            if k.arg is not None:
                given.add(k.arg)
                if isinstance(k.value, ast.Constant):
                    env[k.arg] = k.value.value
        if not (starred or splat):  # otherwise any parameter may have been passed
            for name, default in self.defaults:
                if name not in given and isinstance(default, ast.Constant):
                    env[name] = default.value
        return env


def evaluate(expr: ast.expr, env: dict[str, Any]) -> Any:
    """The value of a test over constants and the parameters in `env`, or UNKNOWN."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.Name):
        return env.get(expr.id, UNKNOWN)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        value = evaluate(expr.operand, env)
        return UNKNOWN if value is UNKNOWN else not value
    if isinstance(expr, ast.BoolOp):
        return _boolean(expr, env)
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in COMPARE:
        left, right = evaluate(expr.left, env), evaluate(expr.comparators[0], env)
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        try:
            return bool(COMPARE[type(expr.ops[0])](left, right))
        except TypeError:
            return UNKNOWN
    return UNKNOWN


def _is(value: Any, truth: bool) -> bool:
    return value is not UNKNOWN and bool(value) is truth


def _boolean(expr: ast.BoolOp, env: dict[str, Any]) -> Any:
    stop = isinstance(expr.op, ast.Or)  # the value that decides: True for `or`
    unknown = False
    for value in (evaluate(v, env) for v in expr.values):
        if value is UNKNOWN:
            unknown = True
        elif bool(value) is stop:
            return stop
    return UNKNOWN if unknown else not stop


def gate_of(ctx: Context, func: ast.FunctionDef | ast.AsyncFunctionDef,
            running: Iterable[ast.Call]) -> Gate | None:
    """The gate of `func`, whose calls `running` run a collective: None when one of them
    runs under no test of `func`'s parameters (or inside a nested function)."""
    args = func.args
    positional = tuple(a.arg for a in args.posonlyargs + args.args)
    params = set(positional) | {a.arg for a in args.kwonlyargs}
    params -= {n.id for n in subtree(func) if isinstance(n, ast.Name)  # rebound: unknown
               and isinstance(n.ctx, (ast.Store, ast.Del))}
    paths = []
    for call in running:
        path = _conditions(ctx, func, call, params)
        if not path:
            return None
        paths.append(path)
    if not paths:
        return None
    tail = positional[len(positional) - len(args.defaults):] if args.defaults else ()
    defaults = tuple(zip(tail, args.defaults)) + tuple(
        (a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None)
    decorators = {d.id for d in func.decorator_list if isinstance(d, ast.Name)}
    receiver = "" if not isinstance(ctx.parents.get(func), ast.ClassDef) or \
        "staticmethod" in decorators else "cls" if "classmethod" in decorators else "self"
    return Gate(positional, receiver, defaults, tuple(paths))


def _conditions(ctx: Context, func: ast.AST, call: ast.Call, params: set[str]
                ) -> tuple[Condition, ...]:
    """The tests of `params` that `call` runs under inside `func` (empty: none, or the
    call is in a nested function)."""
    found: list[Condition] = []
    child: ast.AST = call
    node = ctx.parents.get(call)
    while node is not None and node is not func:
        if isinstance(node, (*FUNCTIONS, ast.Lambda)):
            return ()
        if isinstance(node, (ast.If, ast.IfExp)) and child is not node.test \
                and _reads(node.test, params):
            body = node.body if isinstance(node, ast.If) else [node.body]
            found.append((node.test, child in body))
        child, node = node, ctx.parents.get(node)
    for stmt in ctx.before(call):
        if isinstance(stmt, ast.If) and _reads(stmt.test, params):
            if _leaves(stmt.body):
                found.append((stmt.test, False))
            elif _leaves(stmt.orelse):
                found.append((stmt.test, True))
    return tuple(found)


def _reads(test: ast.expr, params: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in params for n in walk(test))


def _leaves(block: list[ast.stmt]) -> bool:
    return bool(block) and isinstance(block[-1], (ast.Return, ast.Raise))
