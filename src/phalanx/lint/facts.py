"""Facts about a file that a rule may find established somewhere else, and what a file
is: a script that runs in many processes, or not.

A fact ("the GPU is chosen per rank", "the process group is destroyed", "the sampler's
epoch is set") holds for a file when the file establishes it, or when a linted file that
runs in one program with it does: one it imports (transitively), one that imports it
(`train.py` destroys the process group that `dist_utils.py` created), or one imported by
such an importer (`engine.py`'s `train_one_epoch` sets the epoch of the sampler that
`data.py` built, both imported by `train.py`). Files that merely import the same module
are not connected through it: two entry scripts sharing `utils.py` do not lend each
other their facts. Only files whose text names a fact are parsed for it.

A file also says what kind of program it is: a test that builds a fake, single-process
process group (`backend="fake"`, `world_size=1` with a `FakeStore`/`HashStore`) is not a
distributed script for the rules that count on several ranks, and a model used through
RPC (`rpc.remote`, `RRef`) takes CPU inputs by design.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.lint.engine import Context, dotted, keyword, last

# The names that establish each fact: the call, an alias of it or a reference to it
# (`atexit.register(dist.destroy_process_group)`, `device_module.set_device(...)`,
# `torch.get_device_module(d).set_device(...)`, `torch.accelerator.set_device_index`).
FACT_NAMES = {"set_device": {"set_device", "set_device_index"},
              "destroy": {"destroy_process_group"},
              "set_epoch": {"set_epoch"}}
RPC_NAMES = {"RRef", "remote", "rpc_sync", "rpc_async", "init_rpc"}
FAKE_STORES = {"FakeStore", "HashStore"}
OLD_TORCH_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError"}
FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([\w., \t]+)", re.M)
IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w., \t]+)", re.M)


def facts_of_tree(tree: ast.AST) -> frozenset[str]:
    """The facts a parsed file establishes itself."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Call) and dotted(node).endswith("cuda.device"):
            names.add("set_device")  # with torch.cuda.device(local_rank): ...
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                and t.slice.value == "CUDA_VISIBLE_DEVICES" for t in node.targets):
            names.add("set_device")  # each rank sees only its own GPU
    return frozenset(fact for fact, words in FACT_NAMES.items() if words & names)


def holds(ctx: Context, fact: str) -> bool:
    """Whether `fact` is established in the file of `ctx` or in a linted file connected
    to it by imports (`ctx.facts`, set when a project of several files is linted)."""
    if fact in (getattr(ctx, "facts", None) or ()):
        return True
    own = vars(ctx).get("own_facts")
    if own is None:  # computed once per file, for whichever rule asks first
        own = ctx.own_facts = facts_of_tree(ctx.tree)  # type: ignore[attr-defined]
    return fact in own


@dataclass
class ProjectFacts:
    """Each linted file's own facts and the imports between linted files."""

    own: dict[str, frozenset[str]] = field(default_factory=dict)
    imports: dict[str, set[str]] = field(default_factory=dict)  # file → linted files

    def __post_init__(self) -> None:
        importers: dict[str, set[str]] = {}
        for source, targets in self.imports.items():
            for target in targets:
                importers.setdefault(target, set()).add(source)
        files = set(self.imports) | set(importers) | set(self.own)
        # what runs with a file it imports: its facts and those of all it imports …
        down = _spread({f: self.own.get(f, frozenset()) for f in files}, importers)
        # … and, in the program of every file that imports it, all of that program's
        self.program = _spread(down, self.imports)

    def of(self, name: str) -> frozenset[str]:
        """The facts that hold for file `name`: those of every linted file that runs in a
        program with it — what it imports, what imports it, and what those import."""
        return self.program.get(name, frozenset())


def _spread(facts: dict[str, frozenset[str]], edges: dict[str, set[str]]
            ) -> dict[str, frozenset[str]]:
    """`facts` with each file's facts added to the files `edges` lead to, transitively
    (a fixpoint: each file's set grows at most once per fact, so this is linear)."""
    result = dict(facts)
    todo = [f for f, held in result.items() if held]
    while todo:
        source = todo.pop()
        for target in edges.get(source, ()):
            merged = result.get(target, frozenset()) | result[source]
            if merged != result.get(target):
                result[target] = merged
                todo.append(target)
    return result


def project_facts(paths: Iterable[Path], suffixes: dict[str, str],
                  parsed: dict[str, Context] | None = None) -> ProjectFacts:
    """The facts of the linted files `paths`; `suffixes`: module path → file (unique
    endings of the linted files' module paths, as lint.project.Project holds them);
    `parsed`: files already parsed (their trees are reused)."""
    parsed = parsed or {}
    words = {w for names in FACT_NAMES.values() for w in names} | {"cuda.device",
                                                                  "CUDA_VISIBLE_DEVICES"}
    own: dict[str, frozenset[str]] = {}
    imports: dict[str, set[str]] = {}
    files = {str(p) for p in paths}
    for name in sorted(files):
        try:
            text = Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # reported when the file itself is linted
        imports[name] = imported_files(name, text, files, suffixes)
        if any(w in text for w in words):
            try:
                ctx = parsed.get(name)
                tree = ctx.tree if ctx is not None and ctx.source == text else \
                    ast.parse(text, filename=name)
                own[name] = facts_of_tree(tree)
            except (SyntaxError, ValueError, RecursionError):
                continue
    return ProjectFacts(own, imports)


def imported_files(name: str, text: str, files: set[str], suffixes: dict[str, str]) -> set[str]:
    """The linted files that file `name` imports (read from its text): `import a.b`,
    `from a import b` (module `a`, or module `a.b`), `from .b import c`, `from . import
    b` — a relative import resolved by the file's folder, an absolute one by the module
    path's ending when only one linted file has it."""
    found: set[str] = set()
    for module in IMPORT.findall(text):
        found |= {suffixes.get(m.strip().split(" ")[0], "") for m in module.split(",")}
    for dots, module, names in FROM.findall(text):
        members = [m.strip().split(" ")[0] for m in names.split(",") if m.strip()]
        if dots:
            folder = Path(name).parent
            for _ in range(len(dots) - 1):
                folder = folder.parent
            base = folder.joinpath(*module.split(".")) if module else folder
            candidates = [base.with_suffix(".py"), base / "__init__.py",
                          *(base / f"{m}.py" for m in members)]
            found |= {str(c) for c in candidates if str(c) in files}
        else:
            found |= {suffixes.get(module, "")} | {suffixes.get(f"{module}.{m}", "")
                                                    for m in members}
    return found - {"", name}


def uses_rpc(ctx: Context) -> bool:
    """The file drives a model through RPC (torch.distributed.rpc): the remote side
    places its own tensors, the caller's inputs stay on the CPU."""
    return ctx.mentions(*RPC_NAMES) or any(
        origin.startswith("torch.distributed.rpc") for origin in ctx.imported.values())


def single_process(ctx: Context) -> bool:
    """Every `init_process_group` of the file builds a fake, one-process group (a test
    of distributed code): `backend="fake"`, or `world_size=1` with a FakeStore/HashStore."""
    inits = list(ctx.calls_named("init_process_group"))
    return bool(inits) and all(_fake_group(ctx, call) for call in inits)


def _fake_group(ctx: Context, call: ast.Call) -> bool:
    backend = keyword(call, "backend") or (call.args[0] if call.args else None)
    if isinstance(backend, ast.Constant) and backend.value == "fake":
        return True
    size, store = keyword(call, "world_size"), keyword(call, "store")
    if not (isinstance(size, ast.Constant) and size.value == 1) or store is None:
        return False
    return last(dotted(store)) in FAKE_STORES or dotted(store) in ctx.assigned_from(*FAKE_STORES)


def distributed(ctx: Context) -> bool:
    """A script meant to run as several processes (not a one-process fake group)."""
    return ctx.distributed and not single_process(ctx)


def old_torch_fallback(ctx: Context, node: ast.AST) -> bool:
    """`node` is in code for an older torch: an `except ImportError/AttributeError:`
    handler, or a branch of an `if` that asks for the torch version or `hasattr`."""
    for parent in ctx.ancestors(node):
        if isinstance(parent, ast.ExceptHandler) and parent.type is not None and {
                last(dotted(n)) for n in ast.walk(parent.type)} & OLD_TORCH_ERRORS:
            return True
        if isinstance(parent, (ast.If, ast.IfExp)) and node is not parent.test and \
                _version_test(parent.test):
            return True
    return False


def _version_test(test: ast.AST) -> bool:
    for n in ast.walk(test):
        if isinstance(n, ast.Call) and last(dotted(n)) == "hasattr":
            return True
        name = n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")
        if "version" in name.lower():
            return True
    return False
