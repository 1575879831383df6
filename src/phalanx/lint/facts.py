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

Imports are read from a file's parse where there is one, else from its text (name lists
in parentheses over several lines, Black's layout, and backslash continuations included),
and matched to linted files: relative ones by the file's folder; absolute ones first by
the importing file's own folder (where Python looks first for a script: `from utils
import setup` next to `train.py`), then by the module path's ending when only one linted
file has it; and `from pkg import name`, when `pkg`'s `__init__.py` is not linted, by
the one linted file of `pkg`'s folder that defines `name` at its top level (what the
package re-exports).

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.lint.engine import DISTRIBUTED_MARKERS, Context, dotted, keyword, last, rank_dependent
from phalanx.lint.imports import Modules, defined_names, imported_files
from phalanx.lint.syntax import subtree, walk

# The names that establish each fact: the call, an alias of it or a reference to it
# (`atexit.register(dist.destroy_process_group)`, `device_module.set_device(...)`,
# `torch.get_device_module(d).set_device(...)`, `torch.accelerator.set_device_index`).
FACT_NAMES = {"set_device": {"set_device", "set_device_index"},
              "destroy": {"destroy_process_group"},
              "set_epoch": {"set_epoch"}}
# launchers' per-process variables (beyond RANK, LOCAL_RANK: syntax.rank_dependent)
PER_PROCESS_ENV = {"SLURM_LOCALID", "SLURM_PROCID", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "PMI_RANK"}
RPC_NAMES = {"RRef", "remote", "rpc_sync", "rpc_async", "init_rpc"}
FAKE_STORES = {"FakeStore", "HashStore"}
WORD = re.compile(r"[A-Za-z_]\w*")
DISTRIBUTED = frozenset({"distributed"})  # the fact: part of a distributed program
INIT = "init_process_group"  # FileFacts.initializing


def facts_of_tree(tree: ast.AST, nodes: Sequence[ast.AST] | None = None) -> frozenset[str]:
    """The facts a parsed file establishes itself (`nodes`: its names, attributes, calls
    and assignments, when they are at hand)."""
    names: set[str] = set()
    facts: set[str] = set()
    for node in subtree(tree) if nodes is None else nodes:
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
            if per_rank_value(node.value):
                facts.add("own_gpu")
    return frozenset(facts | {fact for fact, words in FACT_NAMES.items() if words & names})


def per_rank_value(value: ast.AST) -> bool:
    """A value that differs from process to process: it reads a rank (`str(rank)`,
    `devices[rank]`, `os.environ["LOCAL_RANK"]`) or a launcher's per-process variable
    (`os.environ["SLURM_LOCALID"]`)."""
    return rank_dependent(value) or any(
        isinstance(n, ast.Constant) and n.value in PER_PROCESS_ENV for n in walk(value))


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
    """The facts that hold for one file (a frozenset of names, as `holds` asks);
    `mentions`: how many linted files name each identifier in their text; `referenced`:
    how many may use it (`references`); `initializing`: the linted files that call
    init_process_group; `defined`: what the linted files define at their top level."""

    mentions: Mapping[str, int]
    referenced: Mapping[str, int]
    initializing: frozenset[str]
    defined: frozenset[str]

    def __new__(cls, facts: Iterable[str] = (), mentions: Mapping[str, int] | None = None,
                referenced: Mapping[str, int] | None = None,
                initializing: frozenset[str] = frozenset(),
                defined: frozenset[str] = frozenset()) -> FileFacts:
        made = super().__new__(cls, facts)
        made.mentions = mentions if mentions is not None else {}
        made.referenced = referenced if referenced is not None else made.mentions
        made.initializing, made.defined = initializing, defined
        return made


def init_functions(ctx: Context) -> frozenset[str]:
    """The functions of a parsed file that call init_process_group themselves ("": at
    module level, or in a decorated function, which a framework may call)."""
    found: set[str] = set()
    for call in ctx.calls_named(INIT):
        func = ctx.function_of(call)
        decorated = not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or \
            func.decorator_list
        found.add("" if decorated else func.name)  # type: ignore[attr-defined]
    return frozenset(found)


def file_references(ctx: Context) -> frozenset[str]:
    """`references` of a parsed file, found once (the facts and PX705 both ask)."""
    own = vars(ctx).get("_references")
    if own is None:
        own = ctx._references = references(ctx.of(  # type: ignore[attr-defined]
            ast.Import, ast.ImportFrom, ast.Name, ast.Attribute, ast.Constant))
    return own


def references(nodes: Sequence[ast.AST]) -> frozenset[str]:
    """The identifiers a parsed file (`nodes`: every node of its tree) may use to reach a
    linted file's function: names, imported names, attributes, identifier strings
    (`getattr(m, "f")`) — not what it takes from torch (`dist.init_process_group` is
    torch's function, not a linted file's `def init_process_group`)."""
    from_torch = {a.asname or a.name.split(".")[0] for n in nodes
                  if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
                  if (getattr(n, "module", None) or a.name).split(".")[0] == "torch"}
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {a.name.split(".")[-1] for a in node.names
                      if (a.asname or a.name.split(".")[0]) not in from_torch}
        elif isinstance(node, ast.Name) and node.id not in from_torch:
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and \
                dotted(node.value).split(".")[0] not in from_torch:
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.isidentifier():
            found.add(node.value)
    return frozenset(found)


@dataclass
class ProjectFacts:
    """Each linted file's own facts, the imports between linted files, and the
    identifiers each file's text names."""

    own: dict[str, frozenset[str]] = field(default_factory=dict)
    imports: dict[str, set[str]] = field(default_factory=dict)  # file → linted files
    words: dict[str, frozenset[str]] = field(default_factory=dict)  # file → identifiers
    refs: dict[str, frozenset[str]] = field(default_factory=dict)  # file → `references`
    inits: dict[str, frozenset[str]] = field(default_factory=dict)  # `init_functions`
    defined: frozenset[str] = frozenset()  # `defined_names` of every linted file

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
        self.referenced = Counter(w for f, names in self.words.items()
                                  for w in self.refs.get(f, names))
        # files with an init that runs: at module level, or in a function something names
        self.initializing = frozenset(f for f, funcs in self.inits.items() if any(
            not func or self.referenced[func] for func in funcs))

    def of(self, name: str) -> FileFacts:
        """The facts that hold for file `name`: those of every linted file that runs in a
        program with it — its importers (transitively) and everything they import."""
        return FileFacts(self.program.get(name, frozenset()) |
                         self.launched.get(name, frozenset()), self.mentions,
                         self.referenced, self.initializing, self.defined)


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
    `parsed`: files already parsed (their trees are reused; the files parsed here are added
    to it, for the lint to reuse in turn)."""
    parsed = {} if parsed is None else parsed
    fact_words = {w for names in FACT_NAMES.values() for w in names} | {
        "cuda.device", "CUDA_VISIBLE_DEVICES", INIT}
    texts: dict[str, str] = {}
    for name in sorted({str(p) for p in paths}):
        try:
            texts[name] = Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # reported when the file itself is linted
    files = Modules(set(texts), suffixes, {f: defined_names(t) for f, t in texts.items()})
    contexts = {name: ctx for name, ctx in parsed.items()
                if name in texts and ctx.source == texts[name]}
    own: dict[str, frozenset[str]] = {}
    for name, text in texts.items():
        if any(w in text for w in fact_words):
            if name not in contexts:
                try:
                    contexts[name] = parsed[name] = Context(name, text)
                except (SyntaxError, ValueError, RecursionError):
                    continue
            ctx = contexts[name]  # (its facts kept for `holds`)
            own[name] = ctx.own_facts = facts_of_tree(  # type: ignore[attr-defined]
                ctx.tree, ctx.of(ast.Attribute, ast.Name, ast.Call, ast.Assign))
    return ProjectFacts(own, {f: imported_files(f, t, files, contexts[f].of(
                                  ast.Import, ast.ImportFrom) if f in contexts else None)
                              for f, t in texts.items()},
                        {f: frozenset(WORD.findall(t)) for f, t in texts.items()},
                        {f: file_references(ctx) for f, ctx in contexts.items()},
                        {f: init_functions(ctx) for f, ctx in contexts.items()
                         if INIT in texts[f]},
                        frozenset().union(*files.defines.values()))


def uses_rpc(ctx: Context) -> bool:
    """The file drives a model through RPC (torch.distributed.rpc): the remote side
    places its own tensors, the caller's inputs stay on the CPU."""
    return ctx.mentions(*RPC_NAMES) or any(
        origin.startswith("torch.distributed.rpc") for origin in ctx.imported.values())


def single_process(ctx: Context) -> bool:
    """Every `init_process_group` of the file builds a fake, one-process group (a test
    of distributed code): `backend="fake"`, or `world_size=1` with a FakeStore/HashStore."""
    inits = list(ctx.calls_named("init_process_group"))
    return bool(inits) and all(fake_group(ctx, call) for call in inits)


def fake_group(ctx: Context, call: ast.Call) -> bool:
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
