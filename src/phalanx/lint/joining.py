"""Where every rank joins a collective that a rank condition guards, so PX301/PX303 stay
silent: the other branch calls the same one, "rank 0 first" pairs under two rank
conditions, and ranks that join before they leave."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, dotted, last, subtree
from phalanx.lint.guards import Guard
from phalanx.lint.syntax import walk


def joins_before_exit(guard: Guard, callee: str) -> bool:
    """`if rank != 0: dist.barrier(); return` … `dist.barrier()`: the ranks that leave
    join the same collective on their way out."""
    if guard.kind != "return" or not isinstance(guard.cond, ast.If):
        return False
    leaving = guard.cond.orelse if guard.holds else guard.cond.body
    return any(isinstance(n, ast.Call) and last(dotted(n)) == callee
               for s in leaving for n in walk(s))


def other_branch_joins(ctx: Context, call: ast.Call, callee: str) -> bool:
    """`if rank == src: broadcast(x, src) else: broadcast(y, src)` — every rank joins: at
    some enclosing rank condition, the other branch calls the same collective (or helper)."""
    child: ast.AST = call
    for parent in ctx.ancestors(call):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        if isinstance(parent, ast.If) and child is not parent.test and \
                ctx.rank_dependent(parent.test):
            other = parent.orelse if child in parent.body else parent.body
            if any(isinstance(n, ast.Call) and last(dotted(n)) == callee
                   for s in other for n in walk(s)):
                return True
        child = parent
    return False


def paired(ctx: Context, call: ast.Call, guard: Guard, callee: str) -> bool:
    """"Rank 0 first": `if rank > 0: barrier()` … `if rank == 0: barrier()` — the same
    collective under another rank condition in the same function (or the other side of
    the same one: `if rank != 0: barrier(); return` … `barrier()`): each rank joins one."""
    scope = ctx.function_of(call)
    for other in subtree(scope):
        if isinstance(other, ast.Call) and other is not call and last(dotted(other)) == callee:
            theirs = ctx.rank_guard(other, callers=False)
            if theirs is None:
                continue
            if theirs.cond is guard.cond and theirs.holds != guard.holds:
                return True
            if theirs.cond is not guard.cond and \
                    ast.unparse(theirs.test) != ast.unparse(guard.test):
                return True
    return False
