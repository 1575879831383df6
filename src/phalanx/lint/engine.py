"""The rule engine of `phalanx lint`: parse a file with `ast` (never import or run it),
give every rule the same `Context`, and collect findings minus inline suppressions.

A rule is a `Rule` (code, severity, message, fix, a wrong and a right example) plus a
function `check(ctx) -> iterable of (node, detail)` or `(node, detail, related lines)`
(one finding per root cause, naming the other lines it causes: `Finding.related`). The examples are documentation
(`phalanx lint --explain CODE`) and the tests' fixtures: the rule must fire on `wrong`
at the line marked `# <-`, and stay silent on `right`.
"""

from __future__ import annotations

import ast
import gc
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from phalanx.lint.syntax import (  # noqa: F401  (re-exported: the rules import them from here)
    RANK_CALLS,
    RANK_NAMES,
    dotted,
    is_true,
    keyword,
    last,
    rank_call,
    rank_dependent,
    subtree,
    walk,
    whether_distributed,
)

if TYPE_CHECKING:
    from phalanx.lint.gates import Gate
    from phalanx.lint.guards import Guard

SEVERITIES = ("error", "warning", "info")
SUPPRESS = re.compile(r"#\s*phalanx:\s*ignore\[([A-Z0-9, ]+)\]")
DISTRIBUTED_MARKERS = {"init_process_group", "DistributedDataParallel", "DDP",
                       "DistributedSampler", "all_reduce", "LOCAL_RANK", "barrier",
                       "get_rank", "get_world_size"}


@dataclass(frozen=True)
class Rule:
    code: str
    severity: str
    message: str  # one line: what is wrong
    fix: str  # one line: how to fix it
    wrong: str  # a short example the rule finds (the line marked `# <-`)
    right: str  # the corrected example, which it must not find
    # (node, detail) or (node, detail, related lines): see Finding.related
    check: Callable[[Context], Iterable[tuple]] = field(compare=False)
    family: str = ""


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    severity: str
    message: str
    fix: str
    related: tuple[int, ...] = ()  # other lines of the same root cause


class Context:
    """One parsed file and the questions rules ask about it."""

    def __init__(self, path: str, source: str, project: dict[str, str] | None = None) -> None:
        self.path, self.source = path, source
        self.project = project or {}  # other linted files' functions that run collectives
        self.forward_only: set[str] = set()  # those of them whose one is a DDP forward
        self.module_prefix_stripped: bool | None = None  # by any linted file (None: unknown)
        self.tree = ast.parse(source, filename=path)
        self.lines = source.splitlines()
        self.parents: dict[ast.AST, ast.AST] = {}
        self.nodes = walk(self.tree, self.parents)  # every node, walked once
        self.tree._phalanx_subtree = self.nodes  # type: ignore[attr-defined]  # (subtree's)
        self.memo: dict[str, dict] = {}  # analyses' caches, per analysis
        self._types: dict[type, list[ast.AST]] = {}  # each node type's nodes, walk order
        for node in self.nodes:
            found = self._types.get(type(node))
            if found is None:
                self._types[type(node)] = [node]
            else:
                found.append(node)
        self.calls: list[ast.Call] = self.of(ast.Call)
        self._by_name: dict[str, list[ast.Call]] = {}
        for call in self.calls:
            self._by_name.setdefault(last(dotted(call)), []).append(call)
        self.distributed = self._mentions_distributed()
        self.imported: dict[str, str] = {}  # local name -> `module.name` it was imported as
        for node in self.of(ast.ImportFrom, ast.Import):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imported[alias.asname or alias.name.split(".")[0]] = alias.name
        self.uses_cuda = "cuda" in source
        self.defined = {n.name for n in  # names this file defines itself
                        self.of(ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)}
        self._call_index: dict | None = None  # lint.guards._index (cached)
        self._rank_names: set[str] | None = None
        self._rank_tests: dict[ast.AST, bool] | None = None  # rank_dependent's answers
        self.external: dict[str, list] = {}  # calls from other linted files: lint.callers
        self.gates: dict[str, Gate] = {}  # the other files' helpers seen: lint.gates
        self.takers: dict[str, tuple] = {}  # the other files' model-running helpers seen

    def of(self, *types: type) -> list:
        """This file's nodes of these exact node types (`ast.Call`, not `ast.expr`), in
        `walk`'s order: indexed once, not found again by `isinstance` over every node (the
        list is the index's own: read it, do not change it)."""
        if len(types) == 1:
            return self._types.get(types[0], [])
        found = self.memo.setdefault("of", {}).get(types)
        if found is None:  # (the types' own lists, merged back into walk order)
            position = self.memo.setdefault("position", {})
            if not position:
                position.update((node, i) for i, node in enumerate(self.nodes))
            found = self.memo["of"][types] = sorted(
                (n for t in dict.fromkeys(types) for n in self._types.get(t, ())),
                key=position.__getitem__)
        return found

    def _mentions_distributed(self) -> bool:
        if not self._by_name.keys().isdisjoint(DISTRIBUTED_MARKERS):
            return True
        return any(n.id in DISTRIBUTED_MARKERS for n in self.of(ast.Name)) or any(
            n.attr in DISTRIBUTED_MARKERS for n in self.of(ast.Attribute)) or any(
            n.value in DISTRIBUTED_MARKERS for n in self.of(ast.Constant)
            if isinstance(n.value, str))

    def calls_named(self, *names: str) -> Iterator[ast.Call]:
        """Calls whose callable's last name is one of `names` (`x.all_reduce`, `DDP`), in
        source order."""
        found = [c for name in names for c in self._by_name.get(name, ())]
        yield from sorted(found, key=lambda c: (c.lineno, c.col_offset))

    def mentions(self, *names: str) -> bool:
        """Whether any call's callable has one of these last names."""
        return any(name in self._by_name for name in names)

    def assigned_from(self, *names: str) -> set[str]:
        """Names (`m`, `self.m`) assigned the result of a call whose last name is one of
        `names`: `model = DDP(net)` → {"model"} for `assigned_from("DDP")`."""
        return {dotted(t) for n in self.of(ast.Assign)
                if isinstance(n.value, ast.Call) and last(dotted(n.value)) in names
                for t in n.targets} - {""}

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def function_of(self, node: ast.AST) -> ast.AST:
        return next((a for a in self.ancestors(node)
                     if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))), self.tree)

    def statement_of(self, node: ast.AST) -> ast.AST:
        """The statement `node` is part of (itself if it is one)."""
        return node if isinstance(node, ast.stmt) else next(
            (a for a in self.ancestors(node) if isinstance(a, ast.stmt)), self.tree)

    def before(self, node: ast.AST) -> list[ast.stmt]:
        """Statements that may run before `node` in its function, on its path: what
        precedes it in its block and in each enclosing block — not the other branch of an
        enclosing `if`/`try`, nothing of another function. (A preceding `if` counts with
        both branches: it may have run.)"""
        return self._path(node, lambda block, i: block[:i])

    def after(self, node: ast.AST) -> list[ast.stmt]:
        """Statements that may run after `node` on its path, in its function."""
        return self._path(node, lambda block, i: block[i + 1:])

    def _path(self, node: ast.AST, part) -> list[ast.stmt]:
        found: list[ast.stmt] = []
        child = self.statement_of(node)
        for parent in self.ancestors(child):
            for name in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(parent, name, None)
                if isinstance(block, list) and child in block:
                    found += part(block, block.index(child))
                    break
            if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                break
            child = parent
        return found

    @property
    def rank_names(self) -> set[str]:
        """Names holding a rank or a test of it, beyond RANK_NAMES: `self.gpu_id =
        int(os.environ["LOCAL_RANK"])`, `master = ddp_rank == 0` (not a device or a path
        built from one: only plain reads, conversions and comparisons), and a property
        returning one, read as `self.prop` (`return dist.get_rank() == 0`)."""
        if self._rank_names is None:
            self._rank_names = set()
            assigns = [n for n in self.of(ast.Assign) if (_plain(n.value) or _rank_named(n))
                       and not whether_distributed(n.value)]
            properties = [f for f in self.of(ast.FunctionDef, ast.AsyncFunctionDef)
                          if _a_property(f)]
            for _ in range(3):  # `master = gpu_id == 0` after `gpu_id = LOCAL_RANK`
                # (what holds a rank keeps holding one as names are added: ask the rest;
                # the properties see this round's assignments)
                held = [n for n in assigns if self._holds_rank(n)]
                self._rank_names |= {dotted(t) for n in held for t in n.targets
                                     if isinstance(t, (ast.Name, ast.Attribute))}
                rank_properties = [f for f in properties if _rank_property(self, f)]
                self._rank_names |= {f"self.{getattr(f, 'name', '')}"
                                     for f in rank_properties}
                if not held and not rank_properties:
                    break  # (nothing new: a further round would find nothing either)
                done = set(held) | set(rank_properties)
                assigns = [n for n in assigns if n not in done]
                properties = [f for f in properties if f not in done]
            self._rank_tests = {}  # (the names are known: rank_dependent may remember)
        return self._rank_names

    def _holds_rank(self, assign: ast.Assign) -> bool:
        """The assigned value reads a rank, or is a parameter that every call of its
        function passes one (`self.gpu_id = gpu_id` with `Trainer(..., rank, ...)`)."""
        if self.rank_dependent(assign.value):
            return True
        from phalanx.lint.guards import passed_rank
        func = self.function_of(assign)
        return isinstance(assign.value, ast.Name) and \
            isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
            passed_rank(self, func, assign.value.id)

    def rank_dependent(self, expr: ast.AST) -> bool:
        """`rank_dependent`, also through this file's names that hold a rank (once per
        expression when those are known: the guard analyses ask again and again)."""
        known = self._rank_tests
        if known is not None and expr in known:
            return known[expr]
        found = rank_dependent(expr)
        if not found:
            names = self._rank_names if self._rank_names is not None else self.rank_names
            found = bool(names) and any(isinstance(n, (ast.Name, ast.Attribute))
                                        and dotted(n) in names for n in walk(expr))
        if self._rank_tests is not None:
            self._rank_tests[expr] = found
        return found

    def rank_guards(self, node: ast.AST, callers: bool = True) -> list[Guard]:
        """Every rank condition `node` runs under, nearest first: enclosing rank-dependent
        ifs, early exits on its path (`if rank != 0: return`), and — with `callers` — a
        guard shared by every call site in this file of the function it is in."""
        from phalanx.lint.guards import all_guards
        return all_guards(self, node, callers=callers)

    def rank_guard(self, node: ast.AST, callers: bool = True) -> Guard | None:
        guards = self.rank_guards(node, callers)
        return guards[0] if guards else None

    def rank_condition(self, node: ast.AST) -> ast.If | ast.IfExp | None:
        """The nearest rank-dependent `if` (statement or expression) `node` runs under:
        enclosing it, an early exit before it, or around every call of its function."""
        guard = self.rank_guard(node)
        return guard.cond if guard is not None else None


def calls_in(statements: list[ast.stmt]) -> Iterator[ast.Call]:
    """Every call inside `statements` (nested blocks included)."""
    for statement in statements:
        for node in walk(statement):
            if isinstance(node, ast.Call):
                yield node


def _plain(value: ast.AST) -> bool:
    """A value that is a rank (or a test of one) when it reads one: a name, a comparison,
    `int(os.environ["LOCAL_RANK"])`, `dist.get_rank()` — not `torch.device(...)`."""
    if isinstance(value, (ast.Name, ast.Attribute, ast.Compare, ast.BoolOp, ast.UnaryOp)):
        return True
    if isinstance(value, ast.Subscript):  # os.environ["LOCAL_RANK"], not data[rank]
        return dotted(value.value).endswith("environ")
    return isinstance(value, ast.Call) and (
        dotted(value) in ("int", "os.environ.get", "os.getenv", "environ.get", "getenv")
        or rank_call(dotted(value)))


def _a_property(func: ast.AST) -> bool:
    """A function decorated `@property` (or `cached_property`)."""
    return isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        dotted(d) in ("property", "functools.cached_property", "cached_property")
        for d in func.decorator_list)


def _rank_property(ctx: Context, func: ast.AST) -> bool:
    """`@property def is_saver(self): return self.rank == 0`: a value it returns is a
    plain rank read or test."""
    if not _a_property(func):
        return False
    values = [r.value for r in subtree(func) if isinstance(r, ast.Return)]
    return any(v is not None and _plain(v) and not whether_distributed(v)
               and ctx.rank_dependent(v) for v in values)


def _rank_named(assign: ast.Assign) -> bool:
    """`dp_rank = mpu.get_data_parallel_rank() if dist.is_initialized() else 0`: a name
    ending in `_rank` holds a rank whatever expression reads it."""
    return all(isinstance(t, (ast.Name, ast.Attribute)) and last(dotted(t)).endswith("_rank")
               for t in assign.targets)


def suppressed(ctx: Context, line: int, code: str) -> bool:
    text = ctx.lines[line - 1] if 0 < line <= len(ctx.lines) else ""
    found = SUPPRESS.search(text)
    return found is not None and code in {c.strip() for c in found[1].split(",")}


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a lint runs, on again after: the parsed
    trees of the linted files live until the run ends, so each collection would walk them
    all again with nothing to free (30–40 % of a run over the lint study's 200 k lines;
    the peak memory measured the same: benchmarks/README.md)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def lint_source(path: str, source: str, rules: Iterable[Rule], project=None) -> list[Finding]:
    """Findings of `rules` in one file; `project`: the other linted files' functions that
    run collectives (lint.project.Project), seen through this file's imports."""
    ctx = project.context(path, source) if project is not None else Context(path, source)
    findings = []
    for rule in rules:
        for found in rule.check(ctx):
            node, detail = found[0], found[1]
            related = tuple(found[2]) if len(found) > 2 else ()
            line, col = getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1
            if not suppressed(ctx, line, rule.code):
                message = f"{rule.message} {detail}".strip()
                findings.append(Finding(path, line, col, rule.code, rule.severity, message,
                                        rule.fix, related))
    return sorted(set(findings), key=lambda f: (f.path, f.line, f.col, f.code))
