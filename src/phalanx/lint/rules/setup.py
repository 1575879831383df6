"""Process-group setup and teardown, DDP options, BatchNorm, rank-0 metrics."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, is_true, keyword, last
from phalanx.lint.facts import distributed, fake_group, file_references, holds, single_process
from phalanx.lint.rules.collectives import COLLECTIVES, collective_functions
from phalanx.lint.syntax import subtree, walk

# DistributedDataParallel's keywords, torch 2.6 to 2.13.
DDP_KEYWORDS = {"module", "device_ids", "output_device", "dim", "broadcast_buffers", "init_sync",
                "process_group", "bucket_cap_mb", "find_unused_parameters", "check_reduction",
                "gradient_as_bucket_view", "static_graph", "delay_all_reduce_named_params",
                "param_to_hook_all_reduce", "mixed_precision", "device_mesh",
                "skip_all_reduce_unused_params", "bucket_cap_mb_list", "batched_grad_copy",
                "forward_sync_buffers"}
LOGGERS = {"print", "log", "info", "add_scalar", "add_scalars", "log_metrics", "log_dict",
           "set_postfix", "write"}
METRIC_WORDS = ("loss", "acc", "ppl", "perplexity")
LOOPBACK = {"localhost", "127.0.0.1", "::1"}


def _hard_coded_master(ctx: Context):
    """A constant MASTER_PORT, or a constant MASTER_ADDR other than the loopback address
    (the right one for a job on one machine: only the port can collide there) — not a
    default set only when the launcher set none (`if "MASTER_PORT" not in os.environ:`,
    `if not os.getenv("MASTER_ADDR"):`, the `else` of `elif "MASTER_PORT" in
    os.environ:`): the `os.environ.setdefault` the fix suggests."""
    for node in ctx.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
                        and target.slice.value in ("MASTER_PORT", "MASTER_ADDR") and not (
                        target.slice.value == "MASTER_ADDR" and node.value.value in LOOPBACK) \
                        and not _only_when_unset(ctx, node, target.slice.value):
                    yield node, f"(`{target.slice.value}` = {node.value.value!r})"


def _only_when_unset(ctx: Context, node: ast.AST, key: str) -> bool:
    """`node` runs only on a side of an `if` whose test says the environment variable
    `key` is not set."""
    child = node
    for parent in ctx.ancestors(node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(parent, ast.If) and child is not parent.test:
            unset = _unset_when(parent.test, key)
            if unset is not None and unset == (child in parent.body):
                return True
        child = parent
    return False


def _unset_when(test: ast.AST, key: str) -> bool | None:
    """The value of `test` that says `key` is unset in the environment (None: it does not
    ask): `"K" not in os.environ` → True, `"K" in os.environ` → False, `not
    os.getenv("K")` → True, `os.environ.get("K") is None` → True."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _unset_when(test.operand, key)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):  # true: each is
        return True if any(_unset_when(v, key) is True for v in test.values) else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, (ast.In, ast.NotIn)) and _is_key(left, key) and \
                dotted(right).endswith("environ"):
            return isinstance(op, ast.NotIn)
        if isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) and _env_read(left, key) \
                and isinstance(right, ast.Constant) and right.value in (None, ""):
            return isinstance(op, (ast.Is, ast.Eq))
    return False if _env_read(test, key) else None


def _is_key(node: ast.AST, key: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == key


def _env_read(node: ast.AST, key: str) -> bool:
    """`os.getenv("K")`, `os.environ.get("K")` (empty or None when unset)."""
    return isinstance(node, ast.Call) and bool(node.args) and _is_key(node.args[0], key) \
        and (dotted(node).endswith("getenv") or dotted(node).endswith("environ.get"))


def _no_destroy(ctx: Context):
    """init_process_group where neither this file nor a linted file connected to it by
    imports destroys the group (called, or registered: `atexit.register(dist.destroy_
    process_group)`); not for a fake one-process group of a test. The inits in the arms
    of one `if`/`elif`/`else` (nccl, gloo …) are one root cause: one finding, at the
    first. An init in a function that nothing in the linted files calls is skipped when
    another init is reached (a dead helper)."""
    if holds(ctx, "destroy") or single_process(ctx):
        return
    inits = list(ctx.calls_named("init_process_group"))
    live = [call for call in inits if not _never_called(ctx, call)]
    others: frozenset[str] = getattr(getattr(ctx, "facts", None), "initializing",
                                     frozenset()) - {ctx.path}
    if not live and not others:
        live = inits
    groups: list[list[ast.Call]] = []
    for call in live:
        group = next((g for g in groups if all(_apart(ctx, call, o) for o in g)), None)
        if group is None:
            groups.append([call])
        else:
            group.append(call)
    for group in groups:
        lines = [call.lineno for call in group[1:]]
        where = ("the other arm's init on line " if len(lines) == 1 else
                 "the other arms' inits on lines ") + ", ".join(map(str, lines))
        yield group[0], f"(one root cause with {where})" if lines else "", lines


def _apart(ctx: Context, one: ast.AST, other: ast.AST) -> bool:
    """`one` and `other` are on different sides of an `if` (never both run)."""
    sides = dict(_branches(ctx, one))
    return any(sides.get(branch, side) != side for branch, side in _branches(ctx, other))


def _branches(ctx: Context, node: ast.AST) -> list[tuple[ast.If, bool]]:
    """(each `if` around `node`, whether `node` is in its body)."""
    found, child = [], node
    for parent in ctx.ancestors(node):
        if isinstance(parent, ast.If) and child is not parent.test:
            found.append((parent, child in parent.body))
        child = parent
    return found


def _never_called(ctx: Context, node: ast.AST) -> bool:
    """`node` is in a function (not decorated: a framework may call it) that neither this
    file nor another linted file names (`references`) — not by a call, a reference, an
    import or a string."""
    func = ctx.function_of(node)
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or func.decorator_list:
        return False
    own = file_references(ctx)
    referenced = getattr(getattr(ctx, "facts", None), "referenced", {})
    return func.name not in own and referenced.get(func.name, 0) == 0


def builds_nccl(ctx: Context, init: ast.Call) -> bool:
    """Whether init_process_group `init` may create an NCCL communicator: not a fake
    one-process group (`facts.fake_group`), XLA's (`init_method="xla://"`, backend
    "xla"), nor one with a literal backend without NCCL ("gloo", "mpi"); a backend not
    known here (a variable, a conditional, none given: NCCL for CUDA) may."""
    method = keyword(init, "init_method")
    if fake_group(ctx, init) or isinstance(method, ast.Constant) and \
            str(method.value).startswith("xla://"):
        return False
    backend = keyword(init, "backend") or (init.args[0] if init.args else None)
    return not (isinstance(backend, ast.Constant) and isinstance(backend.value, str)
                and "nccl" not in backend.value.lower())


def current_device_used(ctx: Context) -> bool:
    """The file relies on the current CUDA device, GPU 0 in every rank until set_device:
    a bare `x.cuda()` or the device "cuda" (`torch.device("cuda")`, `.to("cuda")`)."""
    return any(isinstance(n, ast.Constant) and n.value == "cuda" for n in ctx.nodes) or any(
        isinstance(c.func, ast.Attribute) and not c.args and not c.keywords
        and dotted(c.func.value) != "torch" for c in ctx.calls_named("cuda"))


def device_picked_before(ctx: Context, init: ast.Call) -> bool:
    """A call before `init`, in its function, to a function the linter cannot see —
    imported from a module other than torch, defined in no linted file — whose name
    says it picks a device (`dev = get_device(name)`, `devices.setup_device()`): its
    body may choose the rank's GPU (Composer's `get_device` builds a `DeviceGPU`,
    whose constructor calls set_device)."""
    scope = ctx.function_of(init)
    known = ctx.defined | getattr(getattr(ctx, "facts", None), "defined", frozenset())
    for call in ctx.calls:
        name = dotted(call)
        origin = ctx.imported.get(name.split(".")[0], "")
        if origin and origin.split(".")[0] != "torch" and "device" in last(name).lower() \
                and last(name) not in known and call.lineno < init.lineno \
                and ctx.function_of(call) is scope:
            return True
    return False


def _find_unused(ctx: Context):
    for call in ctx.calls_named("DistributedDataParallel", "DDP"):
        if is_true(keyword(call, "find_unused_parameters")):
            yield call, ""


def _batchnorm_without_sync(ctx: Context):
    if not ctx.mentions("DistributedDataParallel", "DDP") or \
            ctx.mentions("convert_sync_batchnorm", "SyncBatchNorm"):
        return
    for call in ctx.calls_named("BatchNorm1d", "BatchNorm2d", "BatchNorm3d"):
        yield call, ""


def _torchs_ddp(ctx: Context, call: ast.Call) -> bool:
    """The callee is torch's DistributedDataParallel: imported from torch, reached through
    `torch.`/`nn.`, or (a snippet) neither imported nor defined in the file — not apex's
    nor a class of the file's own."""
    name = dotted(call)
    root = name.split(".")[0]
    origin = ctx.imported.get(root)
    if origin is not None:
        return origin == "torch" or origin.startswith("torch.")
    return root not in ctx.defined


def _unknown_ddp_keyword(ctx: Context):
    for call in ctx.calls_named("DistributedDataParallel", "DDP"):
        if not _torchs_ddp(ctx, call):
            continue
        for kw in call.keywords:
            if kw.arg is not None and kw.arg not in DDP_KEYWORDS:
                hint = (" The collective timeout is `init_process_group(timeout=...)`."
                        if kw.arg == "timeout" else "")
                yield call, f"(`{kw.arg}=`: TypeError at construction.{hint})"


def _reduces(ctx: Context, scope: ast.AST, helpers: dict[str, str]) -> bool:
    """Whether `scope` runs (or calls a helper that runs) a reduction/gather, or calls
    something named like one (`reduce_mean`, `gather_metrics`, `sync_loss`)."""
    for node in subtree(scope):
        if isinstance(node, ast.Call):
            name = last(dotted(node))
            if name in COLLECTIVES or name in helpers or \
                    any(w in name.lower() for w in ("reduce", "gather", "sync", "mean_across")):
                return True
    return False


def _rank0_metrics(ctx: Context):
    if not distributed(ctx):
        return
    helpers = collective_functions(ctx)
    for call in ctx.calls_named(*LOGGERS):
        cond = ctx.rank_condition(call)
        metric = next((n.id for arg in [*call.args, *(k.value for k in call.keywords)]
                       for n in walk(arg) if isinstance(n, ast.Name)
                       and any(w in n.id.lower() for w in METRIC_WORDS)), None)
        if cond is None or metric is None or _reduces(ctx, ctx.function_of(call), helpers):
            continue
        yield call, (f"(`{metric}` under `if {ast.unparse(cond.test)}:` is rank 0's own "
                     f"value, from 1/world_size of the batch)")


RULES = [
    Rule("PX701", "warning", "A hard-coded MASTER_PORT/MASTER_ADDR: two jobs on one machine "
         "collide, and multi-node needs the real address.",
         "Let the launcher set them (torchrun, SLURM, `phalanx train`).",
         "os.environ['MASTER_PORT'] = '12355'  # <-",
         "os.environ.setdefault('MASTER_PORT', str(free_port()))", _hard_coded_master),
    Rule("PX702", "warning", "init_process_group without destroy_process_group: exit can hang "
         "or print warnings.", "Call `dist.destroy_process_group()` at the end (try/finally).",
         "dist.init_process_group('gloo')  # <-\ntrain()",
         "dist.init_process_group('gloo')\ntry:\n    train()\nfinally:\n"
         "    dist.destroy_process_group()", _no_destroy),
    Rule("PX703", "info", "find_unused_parameters=True: a graph traversal every step.",
         "Leave it off unless DDP says parameters received no gradient.",
         "model = DDP(net, find_unused_parameters=True)  # <-",
         "model = DDP(net)", _find_unused),
    Rule("PX704", "warning", "BatchNorm in a DDP model without SyncBatchNorm: each rank "
         "normalises over its own small batch.",
         "`model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` before DDP (GPU only).",
         "net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))  # <-\nmodel = DDP(net)",
         "net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n"
         "model = DDP(nn.SyncBatchNorm.convert_sync_batchnorm(net))", _batchnorm_without_sync),
    Rule("PX705", "info", "A metric logged on rank 0 without any reduction: it describes rank "
         "0's shard only.", "All-reduce (average) it on every rank first, then log on rank 0.",
         "dist.init_process_group('gloo')\nloss = loss_fn(model(x), y)\nif rank == 0:\n"
         "    print(f'loss {loss.item():.3f}')  # <-",
         "dist.init_process_group('gloo')\nloss = loss_fn(model(x), y)\n"
         "avg = loss.detach().clone()\ndist.all_reduce(avg, op=dist.ReduceOp.AVG)\n"
         "if rank == 0:\n    print(f'loss {avg.item():.3f}')", _rank0_metrics),
    Rule("PX706", "error", "An argument DistributedDataParallel does not take.",
         "Remove it; see the DDP signature (torch.nn.parallel.DistributedDataParallel).",
         "model = DDP(net, device_ids=[rank], timeout=timedelta(minutes=30))  # <-",
         "dist.init_process_group('nccl', timeout=timedelta(minutes=30))\n"
         "model = DDP(net, device_ids=[rank])", _unknown_ddp_keyword),
]
