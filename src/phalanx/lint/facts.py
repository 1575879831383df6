"""Facts about a file that a rule may find established somewhere else, and what a file
is: a script that runs in many processes, or not.

A fact ("the GPU is chosen per rank", "the process group is destroyed", "the sampler's
epoch is set") holds for a file when the file establishes it, or when a linted file that
runs in one program with it does. The program of a file is every linted file that
imports it, transitively (its ancestors, itself included), and everything those import,
transitively: `train.py` destroys the process group that `dist_utils.py` created, and
`engine.py`'s `train_one_epoch` sets the epoch of the sampler that `data.py` built, both
imported by `train.py`. Files that merely import the same module are not connected
through it: two entry scripts sharing `utils.py` do not lend each other their facts
(neither is the other's ancestor, nor imported by one). Only files whose text names a
fact are parsed for it.

Imports are read from the text and matched to linted files: relative ones by the
file's folder; absolute ones first by the importing file's own folder (where Python
looks first for a script: `from utils import setup` next to `train.py`), then by the
module path's ending when only one linted file has it; and `from pkg import name`, when
`pkg`'s `__init__.py` is not linted, by the one linted file of `pkg`'s folder that
defines `name` at its top level (what the package re-exports).

Being part of a distributed program is a fact too, and it flows only downwards: a file
is in one when it names a process group, DDP, a DistributedSampler … itself, or when a
linted file that imports it (transitively) does — never because it imports a module
that can set up a process group (`validate.py` importing `utils` next to a
`train.py`). The project also counts, from the texts, how many linted files name each
identifier (`FileFacts.mentions`): a value assigned to a name that no file reads is not
passed on.

A file also says what kind of program it is: a test that builds a fake, single-process
process group (`backend="fake"`, `world_size=1` with a `FakeStore`/`HashStore`) is not a
distributed script for the rules that count on several ranks, and a model used through
RPC (`rpc.remote`, `RRef`) takes CPU inputs by design.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.lint.engine import DISTRIBUTED_MARKERS, Context, dotted, keyword, last

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
TOP_LEVEL = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)|^(\w+)[ \t]*(?::[^=\n]*)?=[^=]",
                       re.M)
WORD = re.compile(r"[A-Za-z_]\w*")
DISTRIBUTED = frozenset({"distributed"})  # the fact: part of a distributed program


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


class FileFacts(frozenset):
    """The facts that hold for one file (a frozenset of names, as `holds` asks), and
    `mentions`: how many linted files name each identifier in their text."""

    mentions: Mapping[str, int]

    def __new__(cls, facts: Iterable[str] = (), mentions: Mapping[str, int] | None = None
                ) -> FileFacts:
        made = super().__new__(cls, facts)
        made.mentions = mentions if mentions is not None else {}
        return made


@dataclass
class ProjectFacts:
    """Each linted file's own facts, the imports between linted files, and the
    identifiers each file's text names."""

    own: dict[str, frozenset[str]] = field(default_factory=dict)
    imports: dict[str, set[str]] = field(default_factory=dict)  # file → linted files
    words: dict[str, frozenset[str]] = field(default_factory=dict)  # file → identifiers

    def __post_init__(self) -> None:
        importers: dict[str, set[str]] = {}
        for source, targets in self.imports.items():
            for target in targets:
                importers.setdefault(target, set()).add(source)
        files = set(self.imports) | set(importers) | set(self.own) | set(self.words)
        # what runs with a file it imports: its facts and those of all it imports …
        down = _spread({f: self.own.get(f, frozenset()) for f in files}, importers)
        # … and, in the program of every file that imports it, all of that program's
        self.program = _spread(down, self.imports)
        # a distributed program: only from the file itself and from its importers
        marked = {f: DISTRIBUTED if self.words.get(f, frozenset()) & DISTRIBUTED_MARKERS
                  else frozenset() for f in files}
        self.launched = _spread(marked, self.imports)
        self.mentions = Counter(w for names in self.words.values() for w in names)

    def of(self, name: str) -> FileFacts:
        """The facts that hold for file `name`: those of every linted file that runs in a
        program with it — its importers (transitively) and everything they import."""
        return FileFacts(self.program.get(name, frozenset()) |
                         self.launched.get(name, frozenset()), self.mentions)


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
    fact_words = {w for names in FACT_NAMES.values() for w in names} | {
        "cuda.device", "CUDA_VISIBLE_DEVICES"}
    texts: dict[str, str] = {}
    for name in sorted({str(p) for p in paths}):
        try:
            texts[name] = Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # reported when the file itself is linted
    files = Modules(set(texts), suffixes, {f: defined_names(t) for f, t in texts.items()})
    own: dict[str, frozenset[str]] = {}
    for name, text in texts.items():
        if any(w in text for w in fact_words):
            try:
                ctx = parsed.get(name)
                tree = ctx.tree if ctx is not None and ctx.source == text else \
                    ast.parse(text, filename=name)
                own[name] = facts_of_tree(tree)
            except (SyntaxError, ValueError, RecursionError):
                continue
    return ProjectFacts(own, {f: imported_files(f, t, files) for f, t in texts.items()},
                        {f: frozenset(WORD.findall(t)) for f, t in texts.items()})


def defined_names(text: str) -> frozenset[str]:
    """What a module's text defines at its top level: functions, classes, assignments."""
    return frozenset(a or b for a, b in TOP_LEVEL.findall(text))


@dataclass
class Modules:
    """How import statements name the linted files: `files`, the unique endings of their
    module paths (`suffixes`), and what each defines at its top level (`defines`)."""

    files: set[str]
    suffixes: dict[str, str]
    defines: dict[str, frozenset[str]] = field(default_factory=dict)
    _owners: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def absolute(self, module: str, importer: str) -> str:
        """The file of `import module` in `importer`: next to it first (a script's own
        folder comes first on sys.path), else the unique file whose module path ends so."""
        base = Path(importer).parent.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if str(candidate) in self.files:
                return str(candidate)
        return self.suffixes.get(module, "")

    def exporting(self, package: str, members: list[str]) -> set[str]:
        """For `from package import members` where `package` is no linted file: the one
        linted file in a folder named `package` that defines each member (what the
        package's unlinted `__init__.py` re-exports)."""
        if not self._owners:  # name → the files defining it, built on first use
            for file, names in self.defines.items():
                for defined in names:
                    self._owners.setdefault(defined, []).append(file)
        parts = tuple(package.split("."))
        found = set()
        for member in members:
            owners = [f for f in self._owners.get(member, ())
                      if Path(f).parent.parts[-len(parts):] == parts]
            found |= set(owners) if len(owners) == 1 else set()
        return found


def imported_files(name: str, text: str, modules: Modules) -> set[str]:
    """The linted files that file `name` imports (read from its text): `import a.b`,
    `from a import b` (module `a`, or module `a.b`, or the file of package `a` that
    defines `b`), `from .b import c`, `from . import b` — see the module docstring."""
    found: set[str] = set()
    for module in IMPORT.findall(text):
        found |= {modules.absolute(m.strip().split(" ")[0], name) for m in module.split(",")}
    for dots, module, names in FROM.findall(text):
        members = [m.strip().split(" ")[0] for m in names.split(",") if m.strip()]
        if dots:
            folder = Path(name).parent
            for _ in range(len(dots) - 1):
                folder = folder.parent
            base = folder.joinpath(*module.split(".")) if module else folder
            candidates = [base.with_suffix(".py"), base / "__init__.py",
                          *(base / f"{m}.py" for m in members)]
            found |= {str(c) for c in candidates if str(c) in modules.files}
            continue
        package = modules.absolute(module, name)
        subs = {modules.absolute(f"{module}.{m}", name) for m in members} - {""}
        found |= {package} | subs
        if not package and not subs:
            found |= modules.exporting(module, members)
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


def distributed_program(ctx: Context) -> bool:
    """The file is part of a program that runs as several processes: it is a distributed
    script itself, or a linted file that imports it (transitively) is one."""
    return distributed(ctx) or (holds(ctx, "distributed") and not single_process(ctx))


def named_elsewhere(ctx: Context, name: str) -> bool:
    """Another linted file's text names `name` (linted alone: no other file)."""
    mentions = getattr(getattr(ctx, "facts", None), "mentions", None) or {}
    own = re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", ctx.source) is not None
    return mentions.get(name, 0) > (1 if own else 0)


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
