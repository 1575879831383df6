"""Multi-node rank semantics: the global rank where a per-node index belongs, and the
local rank where a per-job one belongs.

On 2 nodes × 8 GPUs the global rank (RANK, `dist.get_rank()`) runs 0…15 and the local
rank (LOCAL_RANK) 0…7 on each node. A GPU index is per node: `cuda:9` does not exist.
A "once per job" action (write a shared checkpoint, open the run's logger) guarded by
the local rank runs once per node: twice here, on the same files.

What a name holds is read from the assignment reaching its use, per scope (`rank =
dist.get_rank()`, `local_rank = int(os.environ["LOCAL_RANK"])`, `self.rank = ...`); a
value taken modulo something (`rank % torch.cuda.device_count()`) is no GPU index to
judge, nor is a parameter (the caller's value) — but a rank modulo the GPUs per node
tested against 0 is a local-rank-0 guard (`args.rank % ngpus_per_node == 0`).
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import TypeGuard

from phalanx.lint.bindings import reaching
from phalanx.lint.engine import Context, Rule, dotted, keyword, last
from phalanx.lint.guards import call_sites
from phalanx.lint.syntax import walk

GLOBAL_ENV = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}
LOCAL_ENV = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}
GLOBAL_CALLS, LOCAL_CALLS = {"get_rank", "get_global_rank"}, {"get_local_rank"}
JOB_WIDE = {"save", "save_pretrained", "SummaryWriter", "init", "log_artifact", "push_to_hub"}


def _kind(expr: ast.AST) -> str | None:
    """'global' / 'local' when `expr` is a rank of that kind read from its source."""
    found = None
    for node in walk(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return None  # rank % n: already a per-node index, or deliberately not one
        if isinstance(node, ast.Call) and last(dotted(node)) in GLOBAL_CALLS | LOCAL_CALLS:
            found = "local" if last(dotted(node)) in LOCAL_CALLS else "global"
        elif isinstance(node, ast.Constant) and node.value in GLOBAL_ENV | LOCAL_ENV:
            found = "local" if node.value in LOCAL_ENV else "global"
    return found


Root = tuple[str, tuple, int]  # (kind, what identifies the wrong value, line it is reached)


def _rank_kind(ctx: Context, expr: ast.AST | None, use: ast.AST, depth: int = 0) -> Root | None:
    """(kind, root, anchor) when `expr` at `use` holds a rank of kind 'global'/'local':
    a call reading it, a name whose reaching assignment reads it (all agreeing, for a
    module's or class's name), or a parameter every call of its function in this file
    passes such a rank (the root is then the caller's, anchored at the call)."""
    scope = ctx.function_of(use)
    if isinstance(expr, ast.Call) and not expr.args:
        kind = _kind(expr)
        anchor = getattr(use, "lineno", expr.lineno)
        return (kind, (id(scope), ast.unparse(expr), expr.lineno), anchor) if kind else None
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return None
    where, found = reaching(ctx, expr, use)
    if where == "param" and depth < 3 and isinstance(expr, ast.Name):
        return _passed(ctx, scope, expr.id, depth)
    kinds = {_kind(value) if value is not None else None for _, value in found}
    kind = next(iter(kinds)) if len(kinds) == 1 else None
    if where not in ("local", "outer") or kind is None:
        return None
    line = min(line for line, _ in found)
    return kind, (id(scope), dotted(expr), line), getattr(use, "lineno", line)


def _passed(ctx: Context, func: ast.AST, name: str, depth: int) -> Root | None:
    """The rank every call of `func` in this file passes as its parameter `name`."""
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    sites = call_sites(ctx, func)
    params = [a.arg for a in func.args.posonlyargs + func.args.args]
    if not sites or name not in params:
        return None
    offset = 1 if isinstance(ctx.parents.get(func), ast.ClassDef) else 0  # self
    roots = []
    for site in sites:
        position = params.index(name) - offset
        arg = keyword(site, name) or (site.args[position] if 0 <= position < len(site.args)
                                      and not isinstance(site.args[position], ast.Starred)
                                      else None)
        root = _rank_kind(ctx, arg, site, depth + 1) if arg is not None else None
        if root is None:
            return None
        roots.append(root)
    if len({(kind, key) for kind, key, _ in roots}) != 1:
        return None
    return roots[0]


def _is(ctx: Context, expr: ast.AST | None, kind: str, use: ast.AST) -> TypeGuard[ast.expr]:
    found = _rank_kind(ctx, expr, use)
    return found is not None and found[0] == kind


DEVICE_SETTERS = {"set_device", "set_device_index"}


def _device_indexes(call: ast.Call) -> Sequence[ast.expr | None]:
    """The expressions `call` uses as a GPU index."""
    name = last(dotted(call))
    if name in DEVICE_SETTERS or (name in ("cuda", "to") and isinstance(call.func, ast.Attribute)):
        return call.args[:1]
    if name == "device" and len(call.args) == 2:
        return [call.args[1]]
    if name == "device" and len(call.args) == 1 and not isinstance(call.args[0], ast.Constant):
        arg = call.args[0]
        if isinstance(arg, ast.JoinedStr):
            return [v.value for v in arg.values if isinstance(v, ast.FormattedValue)]
        return [arg]  # torch.device(i) / torch.cuda.device(i): GPU i
    if name in ("DistributedDataParallel", "DDP"):
        ids = keyword(call, "device_ids")
        out = [keyword(call, "output_device")]
        return out + (list(ids.elts) if isinstance(ids, (ast.List, ast.Tuple)) else [])
    return []


def _reads_global_rank(ctx: Context) -> bool:
    """The file reads a global rank somewhere (`_kind` can say 'global' of one of its
    expressions): a call of GLOBAL_CALLS or a GLOBAL_ENV name. Without one, no value of
    it is a global rank, and the bindings need not be followed."""
    return ctx.mentions(*GLOBAL_CALLS) or any(
        isinstance(n.value, str) and n.value in GLOBAL_ENV for n in ctx.of(ast.Constant))


def _global_rank_as_device(ctx: Context):
    """One finding per wrong device variable (per scope and assignment, followed into the
    functions it is passed to), at the use that runs first, naming the others."""
    if not _reads_global_rank(ctx):
        return
    causes: dict[tuple, list[tuple[int, int, ast.expr]]] = {}
    for call in ctx.calls:
        for index in _device_indexes(call):
            if index is None:
                continue
            found = _rank_kind(ctx, index, call)
            if found is not None and found[0] == "global":
                causes.setdefault(found[1], []).append((found[2], index.lineno, index))
    for uses in causes.values():
        uses.sort(key=lambda u: (u[0], u[1], u[2].col_offset))
        first = uses[0][2]
        others = sorted({u[1] for u in uses[1:]} - {first.lineno})
        also = f"; also line{'s' if len(others) > 1 else ''} " \
            f"{', '.join(map(str, others))}" if others else ""
        yield first, (f"(`{ast.unparse(first)}` is the global rank: on 2 nodes × 8 GPUs it "
                      f"reaches 15, and the second node's ranks ask for GPUs 8…15{also})"), \
            tuple(others)


PER_NODE_WORDS = ("gpus", "gpu_count", "per_node", "device_count", "nproc")


def _per_node_count(ctx: Context, expr: ast.AST, use: ast.AST) -> bool:
    """`torch.cuda.device_count()`, or a name holding it or named for it (`ngpus_per_node`,
    `args.gpus`: a parameter passed through `mp.spawn` is read by its name)."""
    if isinstance(expr, ast.Call):
        return last(dotted(expr)) == "device_count"
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return False
    _, found = reaching(ctx, expr, use)
    if any(isinstance(v, ast.Call) and last(dotted(v)) == "device_count" for _, v in found):
        return True
    return any(word in last(dotted(expr)).lower() for word in PER_NODE_WORDS)


def _local_rank_value(ctx: Context, expr: ast.AST, use: ast.AST) -> bool:
    """A local rank: read from LOCAL_RANK (directly or through the name holding it), or
    any rank modulo the GPUs per node (`args.rank % ngpus_per_node`: on 2 nodes × 8 GPUs
    it is 0 on one process per node)."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod):
        return ctx.rank_dependent(expr.left) and _per_node_count(ctx, expr.right, use)
    return _is(ctx, expr, "local", use)


def _local_zero(ctx: Context, test: ast.AST, holds: bool) -> bool:
    """The code runs where the local rank is 0: `local_rank == 0` / `not local_rank`
    holding, or `local_rank != 0` / `local_rank > 0` / `local_rank` not holding; through
    `and`/`or` whose other operands do not read a rank (they pick a mode, the same on
    every rank: `not args.distributed or rank % ngpus == 0`)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _local_zero(ctx, test.operand, not holds)
    if isinstance(test, ast.BoolOp):
        # `a and b` holding (`a or b` failing): every operand holds (fails) — one suffices
        if holds == isinstance(test.op, ast.And):
            return any(_local_zero(ctx, v, holds) for v in test.values)
        # `a or b` holding (`a and b` failing): one of them, the others pick no ranks
        return any(_local_zero(ctx, v, holds) and not any(
            ctx.rank_dependent(o) for o in test.values if o is not v) for v in test.values)
    if _local_rank_value(ctx, test, test):
        return not holds
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        zero = [s for s in (left, right) if isinstance(s, ast.Constant) and s.value == 0]
        if not zero or not any(_local_rank_value(ctx, s, test) for s in (left, right)):
            return False
        if isinstance(op, ast.Eq):
            return holds
        return isinstance(op, (ast.NotEq, ast.Gt, ast.Lt)) and not holds
    return False


def _into_memory(ctx: Context, call: ast.Call) -> bool:
    """`torch.save(obj, buffer)` into an `io.BytesIO`: nothing is written yet."""
    target = call.args[1] if len(call.args) > 1 else keyword(call, "f")
    if isinstance(target, ast.Call):
        return last(dotted(target)) == "BytesIO"
    return isinstance(target, ast.Name) and any(
        isinstance(v, ast.Call) and last(dotted(v)) == "BytesIO"
        for _, v in reaching(ctx, target, call)[1])


def _job_wide_under_local_rank(ctx: Context):
    """A job-wide action under a local-rank-0 guard: its own if, an early exit before
    it, or a guard around every call of its function."""
    for call in ctx.calls_named(*JOB_WIDE):
        if last(dotted(call)) == "init" and "wandb" not in dotted(call) or _into_memory(ctx, call):
            continue
        guard = next((g for g in ctx.rank_guards(call) if _local_zero(ctx, g.test, g.holds)),
                     None)
        if guard is not None:
            where = guard.where or f"line {guard.line}"
            via = f" (around the call of `{guard.via}()`)" if guard.via else ""
            yield call, (f"(`{ast.unparse(guard.test)}` at {where}{via} holds on one "
                         f"process per node: on 2 nodes × 8 GPUs two processes run "
                         f"`{last(dotted(call))}` at once)")


RULES = [
    Rule("PX801", "warning", "The global rank used as a GPU index: right on one node only.",
         "Index GPUs by the local rank: `local_rank = int(os.environ['LOCAL_RANK'])`, "
         "`torch.cuda.set_device(local_rank)`, `device_ids=[local_rank]`.",
         "import torch.distributed as dist\nrank = dist.get_rank()\n"
         "torch.cuda.set_device(rank)  # <-",
         "import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
         "torch.cuda.set_device(local_rank)", _global_rank_as_device, family="ranks"),
    Rule("PX802", "warning", "A once-per-job action guarded by the local rank: it runs once "
         "per node.", "Guard it with the global rank: `if dist.get_rank() == 0:` "
         "(keep the local rank for per-node work: a download to node-local disk).",
         "import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\nif local_rank == 0:\n"
         "    torch.save(model.state_dict(), 'ckpt.pt')  # <-",
         "import torch.distributed as dist\nif dist.get_rank() == 0:\n"
         "    torch.save(model.state_dict(), 'ckpt.pt')", _job_wide_under_local_rank,
         family="ranks"),
]
