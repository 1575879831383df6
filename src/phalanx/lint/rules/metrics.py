"""Metric reductions: a SUM reported as a mean, and `reduce`'s result read on every rank."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, dotted, keyword, last
from phalanx.lint.syntax import walk

MEAN_WORDS = ("loss", "mean", "avg", "average", "acc", "ppl", "perplexity", "metric")
REPORTS = {"print", "log", "info", "debug", "warning", "add_scalar", "add_scalars",
           "log_metrics", "log_dict", "write", "set_postfix", "set_description"}


def _torch_dist(call: ast.Call) -> bool:
    """`dist.x(...)`, `torch.distributed.x(...)` or a bare imported `x(...)` — not
    Accelerate's `accelerator.reduce`, which reduces onto every process."""
    name = dotted(call)
    return "." not in name or name.split(".")[-2] in ("dist", "distributed")


def _divides(stmt: ast.stmt, name: str) -> bool:
    """`x /= n`, `x = x / n`, `x.div_(n)`, `x.mul_(1 / n)`, `x = x.mean()`, ..."""
    if isinstance(stmt, ast.AugAssign) and dotted(stmt.target) == name:
        return True
    if isinstance(stmt, ast.Assign) and any(dotted(t) == name for t in stmt.targets):
        return True  # reassigned: whatever it holds now is not the raw sum
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and dotted(n.func.value) == name and n.func.attr in ("div_", "mul_", "mean")
               for n in walk(stmt))


def _reported(ctx: Context, stmt: ast.stmt, name: str) -> ast.AST | None:
    """Where `name` is printed or logged as it is (not divided on the way)."""
    for call in (n for n in walk(stmt) if isinstance(n, ast.Call)):
        if last(dotted(call)) not in REPORTS:
            continue
        for node in walk(call):
            if isinstance(node, ast.Name) and node.id == name and not any(
                    isinstance(a, ast.BinOp) for a in _up_to(ctx, node, call)):
                return node
    return None


def _up_to(ctx: Context, node: ast.AST, top: ast.AST):
    for parent in ctx.ancestors(node):
        if parent is top:
            return
        yield parent


def _sum_reported_as_mean(ctx: Context):
    for call in ctx.calls_named("all_reduce"):
        if not _torch_dist(call) or keyword(call, "op") is not None or len(call.args) != 1 \
                or not isinstance(call.args[0], ast.Name):
            continue
        name = call.args[0].id
        if not any(word in name.lower() for word in MEAN_WORDS):
            continue
        for stmt in ctx.after(call):
            if _divides(stmt, name):
                break
            use = _reported(ctx, stmt, name)
            if use is not None:
                yield use, (f"(`all_reduce({name})` sums over ranks (default op SUM) at line "
                            f"{call.lineno}: on 8 ranks this reports 8 × the mean)")
                break


def _reduce_read_everywhere(ctx: Context):
    """`dist.reduce(x, dst=0)` then `x` reported outside a rank condition."""
    for call in ctx.calls_named("reduce"):
        if not _torch_dist(call) or not call.args or not isinstance(call.args[0], ast.Name):
            continue
        name = call.args[0].id
        for stmt in ctx.after(call):
            if _divides(stmt, name) and not isinstance(stmt, ast.AugAssign):
                break
            use = _reported(ctx, stmt, name)
            if use is not None and ctx.rank_condition(use) is None:
                yield use, (f"(after `reduce` at line {call.lineno} only the destination rank "
                            f"holds the result; the others report their partial value)")
                break


RULES = [
    Rule("PX901", "warning", "A metric all-reduced with the default SUM is reported as if it "
         "were a mean.", "Divide by the world size (`loss /= dist.get_world_size()`), or "
         "reduce with `op=dist.ReduceOp.AVG` (NCCL) — or `run.all_reduce_mean(loss)`.",
         "import torch.distributed as dist\ndist.all_reduce(loss)\n"
         "print(f'loss {loss.item():.3f}')  # <-",
         "import torch.distributed as dist\ndist.all_reduce(loss)\n"
         "loss /= dist.get_world_size()\nprint(f'loss {loss.item():.3f}')",
         _sum_reported_as_mean, family="metrics"),
    Rule("PX902", "warning", "`dist.reduce` result reported on every rank: only `dst` holds it.",
         "Report it under `if dist.get_rank() == dst:`, or use `all_reduce`.",
         "import torch.distributed as dist\ndist.reduce(total, dst=0)\n"
         "print(total.item())  # <-",
         "import torch.distributed as dist\ndist.reduce(total, dst=0)\n"
         "if dist.get_rank() == 0:\n    print(total.item())", _reduce_read_everywhere,
         family="metrics"),
]
