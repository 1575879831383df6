"""Data sharding: samplers, shuffling, set_epoch, downloads."""

from __future__ import annotations

import ast
import re

from phalanx.lint.engine import Context, Rule, calls_in, dotted, is_true, keyword, last
from phalanx.lint.facts import distributed, holds
from phalanx.lint.rules.collectives import collective_functions
from phalanx.lint.syntax import subtree, walk

SHARDERS = {"setup_dataloaders", "prepare", "prepare_data_loader"}  # Fabric, Accelerate
WORLD_NAMES = {"world", "num_replicas", "num_shards", "num_processes", "num_nodes"}
EVAL_WORDS = {"eval", "evaluation", "val", "valid", "validation", "test", "testing"}
WORD_PARTS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")  # `val_loader`, `valLoader` → val
NO_GRAD = {"no_grad", "inference_mode"}
ALL_GATHERS = {"all_gather", "all_gather_object", "all_gather_into_tensor"}


def _sharded_by_framework(ctx: Context, call: ast.Call) -> bool:
    """The loader goes through Fabric's `setup_dataloaders` or Accelerate's `prepare`,
    which add the distributed sampler: directly, or by the name it is assigned to."""
    parent = ctx.parents.get(call)
    if isinstance(parent, ast.Call) and last(dotted(parent)) in SHARDERS:
        return True
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1:
        name = dotted(parent.targets[0])
        return any(dotted(a) == name for c in ctx.calls_named(*SHARDERS) for a in c.args)
    return False


def _loader_without_sampler(ctx: Context):
    if not distributed(ctx):
        return
    for call in ctx.calls_named("DataLoader"):
        if keyword(call, "sampler") is None and keyword(call, "batch_sampler") is None \
                and len(call.args) < 4 and ctx.rank_condition(call) is None \
                and not _sharded_by_framework(ctx, call) \
                and not _may_unpack(ctx, call, {"sampler", "batch_sampler"}) \
                and not _partitioned(ctx, call) and not _read_by_one_rank(ctx, call) \
                and not _replicated(ctx, call):
            yield call, ""


def _read_by_one_rank(ctx: Context, call: ast.Call) -> bool:
    """The loader is built on every rank but used only under a rank condition (`if
    dist.get_rank() == 0: for x in val_loader: ...`): one rank reads the data."""
    parent = ctx.parents.get(call)
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1):
        return False
    name = dotted(parent.targets[0])
    scope = ctx.function_of(call) if isinstance(parent.targets[0], ast.Name) else ctx.tree
    uses = [n for n in subtree(scope) if isinstance(n, (ast.Name, ast.Attribute))
            and isinstance(n.ctx, ast.Load) and dotted(n) == name
            and not (isinstance(p := ctx.parents.get(n), ast.Call) and dotted(p) == "len")]
    return bool(name) and bool(uses) and all(ctx.rank_condition(u) is not None for u in uses)


def _replicated(ctx: Context, call: ast.Call) -> bool:
    """The loader's dataset holds data all-gathered to every rank (`dist.all_gather(
    feats_list, feats)`, `feats = concat_all_gather(x)`, a helper that gathers, then
    `DataLoader(TensorDataset(torch.cat(feats_list)))`): replicated on purpose."""
    dataset = call.args[0] if call.args else keyword(call, "dataset")
    if dataset is None:
        return False
    scope = ctx.function_of(call)
    gathered = _gathered_names(ctx, scope)
    values = [dataset]
    if isinstance(dataset, ast.Name):
        values += [n.value for n in subtree(scope) if isinstance(n, ast.Assign)
                   and any(dotted(t) == dataset.id for t in n.targets)]
    return any(_gathers(ctx, v, gathered) for v in values)


def _gathered_names(ctx: Context, scope: ast.AST) -> set[str]:
    """Names in `scope` holding all-gathered data: the output list of an all_gather, and
    names assigned from a gathering call or from other gathered names."""
    gathered = {dotted(c.args[0]) for c in subtree(scope) if isinstance(c, ast.Call)
                and last(dotted(c)) in ALL_GATHERS and c.args} - {""}
    assigns = [n for n in subtree(scope) if isinstance(n, ast.Assign)]
    for _ in range(3):  # `feats = gather(x)`, then `val = feats`, `ds = TensorDataset(val)`
        for node in assigns:
            if _gathers(ctx, node.value, gathered):
                gathered |= {dotted(e) for t in node.targets
                             for e in (t.elts if isinstance(t, ast.Tuple) else [t])} - {""}
    return gathered


def _gathers(ctx: Context, expr: ast.AST, gathered: set[str]) -> bool:
    """`expr` uses a gathered name or calls something that all-gathers: by its name
    (`all_gather_and_flatten`), or a helper of this or another linted file whose
    collective is an all-gather (`extract_features`)."""
    helpers = vars(ctx).get("_gathering")
    if helpers is None:  # computed once per file
        helpers = ctx._gathering = {  # type: ignore[attr-defined]
            f for f, what in collective_functions(ctx).items()
            if what.split(" ", 1)[0] in ALL_GATHERS}
    for node in walk(expr):
        if isinstance(node, ast.Name) and node.id in gathered:
            return True
        if isinstance(node, ast.Call) and ("all_gather" in last(dotted(node)).lower()
                                           or dotted(node) in helpers):
            return True
    return False


def _partitioned(ctx: Context, call: ast.Call) -> bool:
    """The loader's dataset is already this rank's part: its expression, or the
    assignments of the name it is, depend on the rank or the world size (`Subset(ds,
    range(len(sampler) * world_size, len(ds)))`, `ds.shard(num_shards=w, index=r)`,
    `split_dataset_by_node(ds, rank=r, world_size=w)`)."""
    dataset = call.args[0] if call.args else keyword(call, "dataset")
    if dataset is None:
        return False
    values = [dataset]
    if isinstance(dataset, ast.Name):
        values += [n.value for n in walk(ctx.function_of(call)) if isinstance(n, ast.Assign)
                   and any(dotted(t) == dataset.id for t in n.targets)]
    return any(_by_rank_or_world(ctx, v) for v in values)


def _by_rank_or_world(ctx: Context, expr: ast.AST) -> bool:
    if ctx.rank_dependent(expr):
        return True
    for node in walk(expr):
        name = (node.attr if isinstance(node, ast.Attribute) else
                node.id if isinstance(node, ast.Name) else
                node.arg if isinstance(node, ast.keyword) else None) or ""
        if "world_size" in name.lower() or name in WORLD_NAMES or \
                isinstance(node, ast.Constant) and node.value == "WORLD_SIZE":
            return True
    return False


def _may_unpack(ctx: Context, call: ast.Call, keys: set[str]) -> bool:
    """A `**mapping` of the call may hold one of `keys`: a dict whose keys are all seen
    (`dict(batch_size=8)`, `{"batch_size": 8}`, assigned once in the function and not
    changed after) is judged by them; any other mapping may hold anything."""
    for kw in call.keywords:
        if kw.arg is not None:
            continue
        value: ast.expr | None = kw.value
        if isinstance(value, ast.Name):
            value = _only_value(ctx, value.id, ctx.function_of(call))
        seen = _dict_keys(value) if value is not None else None
        if seen is None or seen & keys:
            return True
    return False


def _only_value(ctx: Context, name: str, scope: ast.AST) -> ast.expr | None:
    """What `name` is bound to in `scope`, when that is one plain assignment and the
    name is never changed in place (`name[k] = v`, `name.update(...)`)."""
    values = []
    for node in subtree(scope):
        if isinstance(node, ast.Assign) and any(dotted(t) == name for t in node.targets):
            values.append(node.value)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Subscript) and dotted(t.value) == name for t in targets):
                return None
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                dotted(node.func.value) == name and node.func.attr in ("update", "setdefault"):
            return None
        elif isinstance(node, ast.arg) and node.arg == name:
            return None  # a parameter: the caller's mapping
    return values[0] if len(values) == 1 else None


def _dict_keys(node: ast.expr) -> set[str] | None:
    """The keys of a dict display or `dict(...)` call, when every one is visible."""
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {str(k.value) for k in node.keys if isinstance(k, ast.Constant)}
    if isinstance(node, ast.Call) and dotted(node) == "dict" and not node.args and \
            all(k.arg is not None for k in node.keywords):
        return {k.arg for k in node.keywords if k.arg is not None}
    return None


def _sampler_and_shuffle(ctx: Context):
    """`shuffle=True` beside a `sampler=` or `batch_sampler=` that is not a literal None:
    DataLoader raises ValueError (each is mutually exclusive with `shuffle`)."""
    for call in ctx.calls_named("DataLoader"):
        given = [k for k in ("sampler", "batch_sampler") if _not_none(keyword(call, k))]
        if given and is_true(keyword(call, "shuffle")):
            yield call, f"(`{given[0]}=` with `shuffle=True`)"


def _not_none(value: ast.expr | None) -> bool:
    return value is not None and not (isinstance(value, ast.Constant) and value.value is None)


def _set_epoch_never_called(ctx: Context):
    """DistributedSampler (shuffling) where neither this file nor a linted file connected
    to it by imports sets an epoch: `sampler.set_epoch(e)`, `loader.sampler.set_epoch(e)`,
    a helper the sampler or its loader is passed to; not one that feeds evaluation."""
    if holds(ctx, "set_epoch"):
        return
    for call in ctx.calls_named("DistributedSampler"):
        if (keyword(call, "shuffle") is None or is_true(keyword(call, "shuffle"))) \
                and not _for_evaluation(ctx, call):
            yield call, ""


def _for_evaluation(ctx: Context, sampler: ast.Call) -> bool:
    """The sampler feeds evaluation, where the order does not matter: it, its dataset or
    the loader it goes into is named for it (`eval_sampler`, `DistributedSampler(
    val_set)`, `test_loader = DataLoader(ds, sampler=s)`), or that loader is only
    iterated under `torch.no_grad()`/`inference_mode()`."""
    names = _assigned(ctx, sampler)
    dataset = sampler.args[0] if sampler.args else keyword(sampler, "dataset")
    loaders = [c for c in ctx.calls_named("DataLoader") if (s := keyword(c, "sampler"))
               is not None and (s is sampler or dotted(s) in names)]
    loader_names = {n for c in loaders for n in _assigned(ctx, c)}
    named = names | loader_names | ({dotted(dataset)} if dataset is not None else set())
    if any(EVAL_WORDS & {w.lower() for w in WORD_PARTS.findall(n)} for n in named):
        return True
    loops = [n for n in ctx.of(ast.For, ast.AsyncFor) if any(
        dotted(m) in loader_names for m in walk(n.iter))]
    return bool(loops) and all(_without_grad(ctx, loop) for loop in loops)


def _assigned(ctx: Context, call: ast.Call) -> set[str]:
    parent = ctx.parents.get(call)
    return {dotted(t) for t in parent.targets} - {""} if isinstance(parent, ast.Assign) \
        else set()


def _without_grad(ctx: Context, node: ast.AST) -> bool:
    """Under `with torch.no_grad():`/`inference_mode()`, or in a function decorated so."""
    for parent in ctx.ancestors(node):
        calls = [i.context_expr for i in parent.items] if isinstance(parent, ast.With) else \
            parent.decorator_list if isinstance(parent, ast.FunctionDef) else []
        if any(last(dotted(c)) in NO_GRAD for c in calls):
            return True
    return False


def _download_on_every_rank(ctx: Context):
    if not distributed(ctx):
        return
    for call in ctx.calls:
        if is_true(keyword(call, "download")) and ctx.rank_condition(call) is None \
                and not _rank_zero_first(ctx, call):
            yield call, ""


def _rank_zero_first(ctx: Context, call: ast.Call) -> bool:
    """Rank 0 downloads while the others wait: a rank-guarded barrier before the call and
    another after it in the same function (`if rank != 0: dist.barrier()` … `if rank ==
    0: dist.barrier()`), or a `with …_first():` block (`main_process_first()`,
    `torch_distributed_zero_first(rank)`)."""
    for parent in ctx.ancestors(call):
        if isinstance(parent, ast.With) and any(
                last(dotted(i.context_expr)).lower().endswith("first") for i in parent.items):
            return True
    waits = _barrier_functions(ctx)
    return any(_guarded_barrier(ctx, s, waits) for s in ctx.before(call)) and \
        any(_guarded_barrier(ctx, s, waits) for s in ctx.after(call))


def _barrier_functions(ctx: Context) -> set[str]:
    """Names of this file's functions that wait at a barrier, and `barrier` itself."""
    return {"barrier"} | {f.name for f in ctx.of(ast.FunctionDef) if any(
        isinstance(c, ast.Call) and "barrier" in last(dotted(c)) for c in walk(f))}


def _guarded_barrier(ctx: Context, stmt: ast.stmt, waits: set[str]) -> bool:
    return isinstance(stmt, ast.If) and ctx.rank_dependent(stmt.test) and any(
        last(dotted(c)) in waits or "barrier" in last(dotted(c))
        for c in calls_in(stmt.body))


RULES = [
    Rule("PX201", "warning", "A DataLoader in a distributed script without a distributed "
         "sampler: every rank reads the whole dataset.",
         "Pass `sampler=DistributedSampler(ds)` (or use `run.loader`).",
         "dist.init_process_group('gloo')\nloader = DataLoader(ds, batch_size=8)  # <-",
         "dist.init_process_group('gloo')\n"
         "loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))",
         _loader_without_sampler),
    Rule("PX202", "error", "`sampler=` and `shuffle=True` together: DataLoader raises "
         "(the sampler decides the order).", "Drop `shuffle=True`; the sampler shuffles.",
         "loader = DataLoader(ds, sampler=sampler, shuffle=True)  # <-",
         "loader = DataLoader(ds, sampler=sampler)", _sampler_and_shuffle),
    Rule("PX203", "warning", "DistributedSampler without set_epoch: every epoch sees the same "
         "order.", "Call `sampler.set_epoch(epoch)` at the start of every epoch.",
         "sampler = DistributedSampler(ds)  # <-\nfor epoch in range(3):\n"
         "    for batch in DataLoader(ds, sampler=sampler):\n        step(batch)",
         "sampler = DistributedSampler(ds)\nfor epoch in range(3):\n"
         "    sampler.set_epoch(epoch)\n    for batch in DataLoader(ds, sampler=sampler):\n"
         "        step(batch)", _set_epoch_never_called),
    Rule("PX204", "warning", "A dataset downloaded by every rank at once: they race on the "
         "same files.", "Download on rank 0 (or local rank 0), barrier, then load everywhere.",
         "dist.init_process_group('gloo')\nds = MNIST('data', download=True)  # <-",
         "dist.init_process_group('gloo')\nif rank == 0:\n    MNIST('data', download=True)\n"
         "dist.barrier()\nds = MNIST('data')", _download_on_every_rank),
]
