"""Multi-node rank semantics: the global rank where a per-node index belongs, and the
local rank where a per-job one belongs.

On 2 nodes × 8 GPUs the global rank (RANK, `dist.get_rank()`) runs 0…15 and the local
rank (LOCAL_RANK) 0…7 on each node. A GPU index is per node: `cuda:9` does not exist.
A "once per job" action (write a shared checkpoint, open the run's logger) guarded by
the local rank runs once per node: twice here, on the same files.

What a name holds is read from where it was assigned (`rank = dist.get_rank()`,
`local_rank = int(os.environ["LOCAL_RANK"])`, `self.rank = ...`); a value taken modulo
something (`rank % torch.cuda.device_count()`) is not judged.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import TypeGuard

from phalanx.lint.engine import Context, Rule, dotted, keyword, last

GLOBAL_ENV = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}
LOCAL_ENV = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"}
GLOBAL_CALLS, LOCAL_CALLS = {"get_rank", "get_global_rank"}, {"get_local_rank"}
JOB_WIDE = {"save", "save_pretrained", "SummaryWriter", "init", "log_artifact", "push_to_hub"}


def _kind(expr: ast.AST) -> str | None:
    """'global' / 'local' when `expr` is a rank of that kind read from its source."""
    found = None
    for node in ast.walk(expr):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return None  # rank % n: already a per-node index, or deliberately not one
        if isinstance(node, ast.Call) and last(dotted(node)) in GLOBAL_CALLS | LOCAL_CALLS:
            found = "local" if last(dotted(node)) in LOCAL_CALLS else "global"
        elif isinstance(node, ast.Constant) and node.value in GLOBAL_ENV | LOCAL_ENV:
            found = "local" if node.value in LOCAL_ENV else "global"
    return found


def _ranks(ctx: Context) -> dict[str, str]:
    """Names (and `self.x`) assigned a rank, with its kind; a name assigned both kinds
    (in different places) is not judged."""
    kinds: dict[str, set[str]] = {}
    for node in ctx.nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            kind = _kind(node.value)
            name = dotted(node.targets[0])
            if name:
                kinds.setdefault(name, set()).add(kind or "other")
    return {name: next(iter(k)) for name, k in kinds.items()
            if len(k) == 1 and next(iter(k)) != "other"}


def _is(expr: ast.AST | None, kind: str, ranks: dict[str, str]) -> TypeGuard[ast.expr]:
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return ranks.get(dotted(expr)) == kind
    return isinstance(expr, ast.Call) and not expr.args and _kind(expr) == kind


def _device_indexes(call: ast.Call) -> Sequence[ast.expr | None]:
    """The expressions `call` uses as a GPU index."""
    name = last(dotted(call))
    if name == "set_device" or (name in ("cuda", "to") and isinstance(call.func, ast.Attribute)):
        return call.args[:1]
    if name == "device" and len(call.args) == 2:
        return [call.args[1]]
    if name == "device" and call.args and isinstance(call.args[0], ast.JoinedStr):
        return [v.value for v in call.args[0].values if isinstance(v, ast.FormattedValue)]
    if name in ("DistributedDataParallel", "DDP"):
        ids = keyword(call, "device_ids")
        out = [keyword(call, "output_device")]
        return out + (list(ids.elts) if isinstance(ids, (ast.List, ast.Tuple)) else [])
    return []


def _global_rank_as_device(ctx: Context):
    ranks = _ranks(ctx)
    for call in ctx.calls:
        for index in _device_indexes(call):
            if _is(index, "global", ranks):
                yield index, (f"(`{ast.unparse(index)}` is the global rank: on 2 nodes × 8 GPUs "
                              f"it reaches 15, and the second node's ranks ask for GPUs 8…15)")


def _local_guard(test: ast.AST, ranks: dict[str, str]) -> bool:
    """`local_rank == 0` / `0 == local_rank` / `not local_rank`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _is(test.operand, "local", ranks)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        zero = [s for s in (left, right) if isinstance(s, ast.Constant) and s.value == 0]
        return bool(zero) and any(_is(s, "local", ranks) for s in (left, right))
    return False


def _job_wide_under_local_rank(ctx: Context):
    ranks = _ranks(ctx)
    for node in ctx.nodes:
        if not (isinstance(node, ast.If) and _local_guard(node.test, ranks)):
            continue
        for stmt in node.body:
            for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
                if last(dotted(call)) in JOB_WIDE and (last(dotted(call)) != "init"
                                                       or "wandb" in dotted(call)):
                    yield call, (f"(`{ast.unparse(node.test)}` holds on one process per node: "
                                 f"on 2 nodes × 8 GPUs two processes run "
                                 f"`{last(dotted(call))}` at once)")


RULES = [
    Rule("PX801", "error", "The global rank used as a GPU index: right on one node only.",
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
