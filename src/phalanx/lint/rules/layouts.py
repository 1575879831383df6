"""Layouts past data parallelism: tensor parallelism (`parallelize_module`, a `tp` mesh
dimension, `phalanx.init(tp=...)`) and pipeline stages (`PipelineStage` or a schedule, a `pp`
dimension, `phalanx.init(pp=...)`) — the data-parallel rank is no longer the global one,
the ranks of a tp group must draw alike, and a plan must name modules that exist."""

from __future__ import annotations

import ast
import fnmatch
import re

from phalanx.lint.engine import Context, Rule, dotted, keyword, last
from phalanx.lint.syntax import walk

TP_CALLS = {"parallelize_module"}
# torch.distributed.pipelining's own names (not `pipeline(...)`: Hugging Face's inference
# `pipeline` shares it)
PP_CALLS = {"PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B"}
SEEDS = {"torch.manual_seed", "manual_seed", "torch.cuda.manual_seed",
         "torch.cuda.manual_seed_all", "random.seed", "np.random.seed", "numpy.random.seed"}
DATA_PARALLEL = re.compile(r"dp|data_parallel|replicate|shard", re.IGNORECASE)
CONTAINERS = {"ModuleList", "ModuleDict", "Sequential"}
MODULE_BASES = {"Module", "nn.Module", "torch.nn.Module"}
BUILTINS = {"range", "len", "enumerate", "zip", "int", "list"}


def _mesh_names(ctx: Context) -> set[str]:
    """The dimension names given to `init_device_mesh(..., mesh_dim_names=(...))`, and the
    layout keywords of `phalanx.init(tp=2, pp=2)` (a size other than 1)."""
    names: set[str] = set()
    for call in ctx.calls_named("init_device_mesh"):
        given = keyword(call, "mesh_dim_names")
        if isinstance(given, (ast.Tuple, ast.List)):
            names |= {e.value for e in given.elts if isinstance(e, ast.Constant)
                      and isinstance(e.value, str)}
    for call in ctx.calls_named("init"):
        for dim in ("tp", "pp"):
            size = keyword(call, dim)
            if size is not None and not (isinstance(size, ast.Constant) and size.value == 1):
                names.add(dim)
    return names


def _tensor_parallel(ctx: Context) -> bool:
    return any(True for _ in ctx.calls_named(*TP_CALLS)) or "tp" in _mesh_names(ctx)


def _pipelined(ctx: Context) -> bool:
    return any(True for _ in ctx.calls_named(*PP_CALLS)) or "pp" in _mesh_names(ctx)


def _global(expr: ast.expr | None, world: bool) -> bool:
    """`dist.get_rank()` / `dist.get_world_size()` over the default group (no group
    argument), or the `RANK` / `WORLD_SIZE` variable: the global rank or world."""
    if expr is None:
        return False
    want = "get_world_size" if world else "get_rank"
    env = "WORLD_SIZE" if world else "RANK"
    return any((isinstance(n, ast.Call) and last(dotted(n)) == want and not n.args
                and not n.keywords) or (isinstance(n, ast.Constant) and n.value == env)
               for n in walk(expr))


def _sampler_by_global_rank(ctx: Context):
    if not (_tensor_parallel(ctx) or _pipelined(ctx)):
        return
    kind = "tensor parallelism" if _tensor_parallel(ctx) else "pipeline stages"
    for call in ctx.calls_named("DistributedSampler"):
        replicas = keyword(call, "num_replicas") or (call.args[1] if len(call.args) > 1 else None)
        rank = keyword(call, "rank") or (call.args[2] if len(call.args) > 2 else None)
        if replicas is None and rank is None:
            yield call, (f"(no `num_replicas`/`rank`: it shards by the global rank and world "
                         f"size, while under {kind} the ranks of one group must read the "
                         f"same batch)")
        elif _global(rank, world=False) or _global(replicas, world=True):
            named = rank if _global(rank, world=False) else replicas
            assert named is not None  # (_global is False for None)
            yield call, (f"(`{ast.unparse(named)}` is "
                         f"the global one; under {kind} the ranks of one group must read "
                         f"the same batch)")


def _seed_differs_across_tp(ctx: Context):
    if not _tensor_parallel(ctx):
        return
    for call in ctx.calls:
        if dotted(call) not in SEEDS or not call.args:
            continue
        seed = call.args[0]
        if ctx.rank_dependent(seed) and not DATA_PARALLEL.search(ast.unparse(seed)):
            yield call, (f"(`{ast.unparse(seed)}` differs on the ranks of a tensor-parallel "
                         f"group: they initialise different weights for the matrices they "
                         f"split, and draw different dropout masks on activations they share)")


def _classes(ctx: Context) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ctx.of(ast.ClassDef)}


def _children(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> dict[str, object] | None:
    """The submodules `cls.__init__` assigns (`self.name = ...`), each mapped to what is
    known of it: a class of this file, "container" (ModuleList/Dict/Sequential: an index
    or key next), or None (a module whose own children are not known here). None for the
    whole class when its children cannot all be known (a base other than nn.Module,
    `add_module`, `setattr`, `register_module`)."""
    if not all(dotted(b) in MODULE_BASES for b in cls.bases):
        return None
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef)
                 and f.name == "__init__"), None)
    if init is None:
        return None
    found: dict[str, object] = {}
    for node in walk(init):
        if isinstance(node, ast.Call) and last(dotted(node)) in {"add_module", "setattr",
                                                                  "register_module"}:
            return None
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and dotted(target.value) == "self":
                    found[target.attr] = _kind(node.value, classes)
    return found


def _kind(value: ast.expr, classes: dict[str, ast.ClassDef]) -> object:
    name = last(dotted(value)) if isinstance(value, ast.Call) else ""
    if name in CONTAINERS:
        return ("container", _element(value, classes))
    return classes.get(name)


def _element(call: ast.expr, classes: dict[str, ast.ClassDef]) -> object:
    """The class of a container's elements (`ModuleList([Block(c) for _ in range(n)])`)."""
    names = {last(dotted(n)) for n in walk(call) if isinstance(n, ast.Call)} - CONTAINERS
    known = [classes[n] for n in names if n in classes]
    return known[0] if len(known) == 1 and names - {known[0].name} <= BUILTINS else None


def _missing(path: str, cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> str | None:
    """The first token of the plan key `path` that names no submodule of `cls` (None: it
    resolves, or the model is not known well enough to say)."""
    here: object = cls
    for token in path.split("."):
        if isinstance(here, tuple):  # a container: any index or key, then its element
            here = here[1]
            continue
        if not isinstance(here, ast.ClassDef):
            return None
        children = _children(here, classes)
        if children is None:
            return None
        matched = [name for name in children if fnmatch.fnmatchcase(name, token)]
        if not matched:
            return token
        here = children[matched[0]] if len(matched) == 1 else None
    return None


def _plan_dict(ctx: Context, plan: ast.expr | None, at: ast.AST) -> ast.Dict | None:
    if isinstance(plan, ast.Dict):
        return plan
    if isinstance(plan, ast.Name):
        scope = ctx.function_of(at)
        values = [n.value for n in walk(scope) if isinstance(n, ast.Assign)
                  and any(dotted(t) == plan.id for t in n.targets)]
        return values[0] if len(values) == 1 and isinstance(values[0], ast.Dict) else None
    return None


def _model_class(ctx: Context, model: ast.expr | None, at: ast.AST,
                 classes: dict[str, ast.ClassDef]) -> ast.ClassDef | None:
    """The class of this file that built `model` (`model = GPT(cfg)`; None: not known)."""
    if isinstance(model, ast.Call):
        return classes.get(last(dotted(model)))
    if not isinstance(model, ast.Name):
        return None
    scope = ctx.function_of(at)  # the last assignment before the call (`model = GPT(c)`)
    values = [n.value for n in sorted(walk(scope), key=lambda n: getattr(n, "lineno", 0))
              if isinstance(n, ast.Assign) and n.lineno < getattr(at, "lineno", 0)
              and any(dotted(t) == model.id for t in n.targets)]
    if not values or not isinstance(values[-1], ast.Call):
        return None
    return classes.get(last(dotted(values[-1])))


def _plan_names_missing_module(ctx: Context):
    classes = _classes(ctx)
    for call in ctx.calls:
        if last(dotted(call)) in TP_CALLS:
            model = call.args[0] if call.args else keyword(call, "module")
            plan = call.args[2] if len(call.args) > 2 else keyword(call, "parallelize_plan")
        elif keyword(call, "tp_plan") is not None:  # phalanx: run.setup(model, opt, tp_plan=)
            model, plan = (call.args[0] if call.args else None), keyword(call, "tp_plan")
        else:
            continue
        cls, table = _model_class(ctx, model, call, classes), _plan_dict(ctx, plan, call)
        if cls is None or table is None:
            continue
        for key in table.keys:
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                token = _missing(key.value, cls, classes)
                if token is not None:
                    yield key, (f"(`{key.value}`: {cls.name} has no submodule matching "
                                f"`{token}`; torch warns and leaves that part unsplit)")


TP_MODEL = ("class MLP(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.up = nn.Linear(8, 32)\n        self.down = nn.Linear(32, 8)\n\n")
RULES = [
    Rule("PX205", "warning", "A DistributedSampler sharded by the global rank under tensor "
         "parallelism or pipeline stages: the ranks of one tp group or pipeline read different "
         "batches.", "Shard by the data-parallel coordinate: `DistributedSampler(ds, "
         "num_replicas=mesh['dp'].size(), rank=mesh['dp'].get_local_rank())` (or `run.loader`).",
         "mesh = init_device_mesh('cuda', (2, 2), mesh_dim_names=('dp', 'tp'))\n"
         "sampler = DistributedSampler(ds)  # <-",
         "mesh = init_device_mesh('cuda', (2, 2), mesh_dim_names=('dp', 'tp'))\n"
         "sampler = DistributedSampler(ds, num_replicas=mesh['dp'].size(),\n"
         "                             rank=mesh['dp'].get_local_rank())",
         _sampler_by_global_rank, family="layouts"),
    Rule("PX109", "warning", "A rank-dependent seed in a tensor-parallel script: the ranks of "
         "a tp group initialise and drop out differently.", "Seed alike on every rank of a "
         "tp group (the base seed, or the seed plus the data-parallel rank).",
         "model = parallelize_module(MLP(), mesh, plan)\n"
         "torch.manual_seed(1234 + dist.get_rank())  # <-",
         "model = parallelize_module(MLP(), mesh, plan)\n"
         "torch.manual_seed(1234 + mesh['dp'].get_local_rank())",
         _seed_differs_across_tp, family="layouts"),
    Rule("PX110", "warning", "A tensor-parallel plan naming a module the model does not have: "
         "that part stays whole on every rank.", "Name the submodules as the model's "
         "`named_modules()` does (`layers.*.attn.proj`).",
         TP_MODEL + "model = parallelize_module(MLP(), mesh, {'up': ColwiseParallel(),\n"
         "                                              'dwn': RowwiseParallel()})  # <-",
         TP_MODEL + "model = parallelize_module(MLP(), mesh, {'up': ColwiseParallel(),\n"
         "                                              'down': RowwiseParallel()})",
         _plan_names_missing_module, family="layouts"),
]
