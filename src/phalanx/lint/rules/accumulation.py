"""Gradient accumulation under DDP: no_sync, and the private sync flag."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule


def _accumulates(ctx: Context) -> ast.If | None:
    """An `if step % K ...:` guarding optimizer.step() — accumulation by hand."""
    for call in ctx.calls_named("step"):
        for parent in ctx.ancestors(call):
            if isinstance(parent, ast.If) and any(isinstance(n, ast.BinOp) and
                                                  isinstance(n.op, ast.Mod)
                                                  for n in ast.walk(parent.test)):
                return parent
    return None


def _accumulation_without_no_sync(ctx: Context):
    if not ctx.mentions("DistributedDataParallel", "DDP") or ctx.mentions("no_sync"):
        return
    guard = _accumulates(ctx)
    if guard is None:
        return
    for call in ctx.calls_named("backward"):
        yield call, (f"(optimizer steps every few micro-steps, `if {ast.unparse(guard.test)}` "
                     f"at line {guard.lineno}, but every backward all-reduces)")


def _private_sync_flag(ctx: Context):
    for node in ctx.nodes:
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "require_backward_grad_sync":
                yield node, ""


RULES = [
    Rule("PX401", "warning", "Gradient accumulation with DDP but no `no_sync()`: gradients "
         "are all-reduced on every micro-step.",
         "Wrap all but the last micro-step in `with model.no_sync():` (or `run.accumulate`).",
         "model = DDP(net)\nfor i, (x, y) in enumerate(loader):\n"
         "    loss_fn(model(x), y).backward()  # <-\n    if (i + 1) % 4 == 0:\n"
         "        opt.step()\n        opt.zero_grad()",
         "model = DDP(net)\nfor i, (x, y) in enumerate(loader):\n"
         "    sync = (i + 1) % 4 == 0\n    with (nullcontext() if sync else model.no_sync()):\n"
         "        loss_fn(model(x), y).backward()\n    if sync:\n        opt.step()\n"
         "        opt.zero_grad()", _accumulation_without_no_sync),
    Rule("PX402", "error", "Setting DDP's private `require_backward_grad_sync`: unsupported, "
         "and easy to leave off.", "Use the `model.no_sync()` context manager.",
         "model.require_backward_grad_sync = False  # <-",
         "with model.no_sync():\n    loss.backward()", _private_sync_flag),
]
