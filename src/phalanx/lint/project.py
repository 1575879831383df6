"""The call graph across the files of one `phalanx lint` run: module-level functions that
run a collective (directly, hidden, or through other helpers), so that a helper defined
in `utils.py` and called under `if rank == 0:` in `train.py` is judged like a helper of
`train.py` itself. A file sees another file's functions only through its own imports
(`from utils import f`, `from pkg.utils import f`, `import utils` then `utils.f()`),
matched to the linted file whose path ends with that module path (when only one does).
Only files that mention torch.distributed or a wrapper — and the files importing those,
transitively — are parsed for this."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.lint.callers import external_callers
from phalanx.lint.engine import Context
from phalanx.lint.facts import ProjectFacts
from phalanx.lint.gates import Gate
from phalanx.lint.guards import forget_caller_guards, rank_decorators
from phalanx.lint.model_args import takers
from phalanx.lint.rules.checkpoints import strips_module_prefix
from phalanx.lint.rules.collectives import kinds_and_gates

WORDS = ("distributed", "dist.", "DDP", "FSDP", "fully_shard", "full_tensor",
         "consolidate_state_dict", "dcp", "accelerator", "fabric")  # where a collective can be
PREFIX = re.compile(r"[\"']\^?module\\?\.[\"']")
IMPORT = re.compile(r"^\s*(?:from\s+\.*([\w.]+)\s+import|import\s+([\w.]+))", re.M)


@dataclass
class Project:
    """The linted files' collective-running functions, and how module paths name files."""

    functions: dict[str, dict[str, str]] = field(default_factory=dict)  # file → name → what
    suffixes: dict[str, str] = field(default_factory=dict)  # `pkg.utils` → file (if unique)
    parsed: dict[str, Context] = field(default_factory=dict)  # reused by the lint itself
    facts: ProjectFacts | None = None  # set by the CLI: lint.facts.project_facts
    callers: dict[str, dict] = field(default_factory=dict)  # file → lint.callers sites
    forward_only: dict[str, set[str]] = field(default_factory=dict)  # file → DDP-forward-only
    module_prefix_stripped: bool = False  # some linted file strips DDP's `module.` prefix
    gates: dict[str, dict[str, Gate]] = field(default_factory=dict)  # file → name → gate
    decorators: dict[str, dict[str, str]] = field(default_factory=dict)  # lint.guards'
    takers: dict[str, dict[str, tuple]] = field(default_factory=dict)  # lint.model_args'

    def take(self, name: str, source: str) -> Context | None:
        """The file's parse from this pass (once), if its source is still the same."""
        ctx = self.parsed.pop(name, None)
        return ctx if ctx is not None and ctx.source == source else None

    def file_of(self, module: str) -> str | None:
        return self.suffixes.get(module)

    def context(self, name: str, source: str) -> Context:
        """The file's parse, with what it sees of the other files' collective functions
        through its own imports (`Context.project`)."""
        ctx = self.take(name, source) or Context(name, source)
        ctx.project, ctx.forward_only = visible(ctx, self), visible_forward_only(ctx, self)
        ctx.gates, ctx.takers = visible_gates(ctx, self), visible_takers(ctx, self)
        see_decorators(ctx, self)
        ctx.external = self.callers.get(name, {})
        ctx.module_prefix_stripped = self.module_prefix_stripped
        forget_caller_guards(ctx)  # asked again with the callers in other files
        ctx.facts = self.facts.of(name) if self.facts else frozenset()  # type: ignore[attr-defined]
        return ctx


def _suffixes(paths: list[Path]) -> dict[str, str]:
    seen: dict[str, set[str]] = {}
    for path in paths:
        parts = list(path.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        for k in range(1, min(len(parts), 6) + 1):
            seen.setdefault(".".join(parts[-k:]), set()).add(str(path))
    return {key: next(iter(files)) for key, files in seen.items() if len(files) == 1}


def _imports(texts: dict[str, str], suffixes: dict[str, str]) -> dict[str, set[str]]:
    """File → the linted files it imports (read from the text: no parsing)."""
    return {f: {s for a, b in IMPORT.findall(t) if (s := suffixes.get(a or b)) is not None}
            for f, t in texts.items()}


def _imports_of(ctx: Context, project: Project, table: dict[str, dict] | None = None
                ) -> list[tuple[str, str, str]]:
    """(the name `ctx` calls it by — `f`, `utils.f` —, file, function) for every function
    of `table` (file → function → …; default: the functions with a collective) that `ctx`
    imports."""
    table = project.functions if table is None else table
    found: list[tuple[str, str, str]] = []
    for local, origin in ctx.imported.items():
        module, _, name = origin.rpartition(".")
        source = project.file_of(module) if module else None
        if source is not None and source in table and name in table[source]:
            found.append((local, source, name))  # from utils import f
        elif (file := project.file_of(origin)) is not None and file in table:  # import utils
            prefix = origin if local == origin.split(".")[0] else local  # `pkg.utils`, `u`
            found += [(f"{prefix}.{function}", file, function) for function in table[file]]
    return found


def visible(ctx: Context, project: Project | None) -> dict[str, str]:
    """What `ctx` imports from the other linted files: the name it calls them by (`f`,
    `utils.f`) → collective."""
    seen: dict[str, str] = {}
    if project is None:
        return seen
    for local, file, function in _imports_of(ctx, project):
        seen.setdefault(local, project.functions[file][function])
    return seen


def visible_forward_only(ctx: Context, project: Project | None) -> set[str]:
    """The names of `visible(ctx, project)` whose only collective is a DDP forward."""
    if project is None:
        return set()
    return {local for local, file, function in _imports_of(ctx, project)
            if function in project.forward_only.get(file, ())}


def visible_gates(ctx: Context, project: Project | None) -> dict[str, Gate]:
    """The gates (lint.gates) of the functions of `visible(ctx, project)` that have one."""
    if project is None:
        return {}
    return {local: gate for local, file, function in _imports_of(ctx, project)
            if (gate := project.gates.get(file, {}).get(function)) is not None}


def visible_takers(ctx: Context, project: Project | None) -> dict[str, tuple]:
    """The other linted files' helpers that run a model they are given (lint.model_args)
    that `ctx` imports, by the name it calls them by."""
    if project is None or not project.takers:
        return {}
    return {local: project.takers[file][function]
            for local, file, function in _imports_of(ctx, project, project.takers)}


def see_decorators(ctx: Context | None, project: Project) -> Context | None:
    """Give `ctx` the rank-only decorators (lint.guards.rank_decorators) it imports from
    the other linted files, by the name it uses them by (`master_only`, `dist.master_only`)."""
    if ctx is None or not project.decorators:
        return ctx
    seen: dict[str, str] = {}
    for local, origin in ctx.imported.items():
        module, _, name = origin.rpartition(".")
        file = project.file_of(module) if module else None
        if file is not None and name in project.decorators.get(file, {}):
            seen[local] = project.decorators[file][name]
        for function, test in project.decorators.get(project.file_of(origin) or "", {}).items():
            seen[f"{local}.{function}"] = test  # import utils: @utils.master_only
    if seen != ctx.memo.get("decorators"):
        ctx.memo["decorators"] = seen
        forget_caller_guards(ctx, decorators=True)
    return ctx


def project_collectives(paths: list[Path], rounds: int = 4) -> Project:
    """Every linted file's module-level functions that run a collective. Parsed: files
    that mention one (round 1), then files importing a file found to have some."""
    texts = {}
    for path in paths:
        try:
            texts[str(path)] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # reported when the file itself is linted
    project = Project(suffixes=_suffixes(paths))
    everything = _imports(texts, project.suffixes)
    imports = {f: s for f, s in everything.items() if "def " in texts[f]}  # may define helpers
    frontier = {f for f in imports if any(word in texts[f] for word in WORDS)}
    contexts: dict[str, Context | None] = {}
    beside = _find_takers(project, texts, everything)  # parsed once: the lint reuses them
    seen: dict[str, tuple] = {}  # what each file saw of the others when judged
    for _ in range(rounds):
        changed = False
        for name in sorted(frontier):
            ctx = contexts[name] if name in contexts else (
                beside.pop(name, None) or _parse(name, texts[name]))
            contexts[name] = ctx
            if ctx is None:
                continue
            ctx.project = visible(ctx, project)
            ctx.forward_only = visible_forward_only(ctx, project)
            ctx.gates, ctx.takers = visible_gates(ctx, project), visible_takers(ctx, project)
            if name in seen and seen[name] == (ctx.project, ctx.forward_only):
                continue
            seen[name] = (ctx.project, ctx.forward_only)
            changed |= _judge(ctx, name, project)
        if not changed:
            break
        frontier = {f for f, targets in imports.items() if targets & project.functions.keys()}
    project.module_prefix_stripped = _strips(texts, contexts)
    project.decorators = {n: found for n, ctx in contexts.items()
                          if ctx is not None and (found := rank_decorators(ctx))}
    for ctx in contexts.values():
        see_decorators(ctx, project)

    def parse(name: str, text: str) -> Context | None:  # (a file parsed for its takers: once)
        return see_decorators(beside.pop(name, None) or _parse(name, text), project)

    project.callers = external_callers(texts, everything, project.suffixes, contexts, parse)
    project.parsed = {**beside, **{name: ctx for name, ctx in contexts.items()
                                   if ctx is not None}}
    return project


def _find_takers(project: Project, texts: dict[str, str], imports: dict[str, set[str]]
                 ) -> dict[str, Context]:
    """The helpers that run a model they are given (lint.model_args), in the files that a
    file naming a wrapper or a collective imports; those files' parses (kept for the lint)."""
    wanted = {t for f, targets in imports.items() if any(word in texts[f] for word in WORDS)
              for t in targets if "def " in texts.get(t, "")}
    parsed: dict[str, Context] = {}
    for name in sorted(wanted):
        ctx = _parse(name, texts[name])
        if ctx is not None:
            parsed[name] = ctx
            if found := takers(ctx.tree):
                project.takers[name] = found
    return parsed


def _strips(texts: dict[str, str], contexts: dict[str, Context | None]) -> bool:
    """Whether a linted file strips DDP's `module.` prefix (parsed only if it names it)."""
    for name, text in texts.items():
        if not PREFIX.search(text):
            continue
        ctx = contexts.get(name)
        try:
            tree = ctx.tree if ctx is not None else ast.parse(text, filename=name)
        except (SyntaxError, ValueError, RecursionError):
            continue
        if strips_module_prefix(tree):
            return True
    return False


def _judge(ctx: Context, name: str, project: Project) -> bool:
    """Record the file's module-level functions that run a collective; whether that changed."""
    top = {n.name for n in ctx.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    definite, forward, gates = kinds_and_gates(ctx)
    project.gates[name] = {f: g for f, g in gates.items() if f in top}
    found = {f: w if "(in " in w else f"{w} (in {Path(name).name})"
             for f, w in {**forward, **definite}.items() if f in top}
    only = set(forward) & top - set(definite)
    if not found or (found, only) == (project.functions.get(name),
                                      project.forward_only.get(name, set())):
        return False
    project.functions[name], project.forward_only[name] = found, only
    return True


def _parse(name: str, text: str) -> Context | None:
    try:
        return Context(name, text)
    except (SyntaxError, ValueError, RecursionError):
        return None


def build_project(paths: list[Path]) -> Project | None:
    """What each linted file sees of the others (Project): their collective-running
    functions and the facts established in files connected to it by imports
    (lint.facts); None for a single file."""
    from phalanx.lint.facts import project_facts

    if len(paths) < 2:
        return None
    project = project_collectives(paths)
    project.facts = project_facts(paths, project.suffixes, project.parsed)
    return project
