"""Mixed precision: GradScaler order, GradScaler with bf16, the deprecated API."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, calls_in, dotted, last
from phalanx.lint.syntax import walk

DEPRECATED_AMP = {"torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler"}
OLD_TORCH_ERRORS = {"ImportError", "ModuleNotFoundError", "AttributeError"}


def _scalers(ctx: Context) -> set[str]:
    """Names bound to a GradScaler (`scaler`, `self.scaler`)."""
    if "GradScaler" not in ctx.source:  # (a call named so names it in the text)
        return set()
    return {dotted(target) for node in ctx.of(ast.Assign)
            if any(isinstance(n, ast.Call) and dotted(n).endswith("GradScaler")
                    for n in walk(node.value))  # also `GradScaler() if amp else None`
            for target in node.targets} - {""}


def _on_scaler(call: ast.Call, method: str, scalers: set[str]) -> bool:
    """`<scaler>.method(...)`: a name bound to a GradScaler, or one called `*scaler*`."""
    if not isinstance(call.func, ast.Attribute) or call.func.attr != method:
        return False
    receiver = dotted(call.func.value)
    return receiver in scalers or "scaler" in last(receiver).lower()


def _clip_before_unscale(ctx: Context):
    """Per path: a clip whose gradients a GradScaler scaled (a `scale(...)` before it, or
    a `scaler.step` after it, on its branch) and no `unscale_` before it on that path.
    A clip on a branch where no scaler is used (AMP off) is not reported."""
    scalers = _scalers(ctx)
    for clip in ctx.calls_named("clip_grad_norm_", "clip_grad_value_"):
        before = list(calls_in(ctx.before(clip)))
        scaled = any(_on_scaler(c, "scale", scalers) for c in before) or any(
            _on_scaler(c, "step", scalers) for c in calls_in(ctx.after(clip)))
        if scaled and not any(dotted(c).endswith("unscale_") or _on_scaler(c, "step", scalers)
                              for c in before):  # (`scaler.step` unscales them in place)
            yield clip, "(the gradients it clips are still multiplied by the loss scale)"


def _scaler_with_bf16(ctx: Context):
    if "bfloat16" not in ctx.source or "float16" in ctx.source.replace("bfloat16", ""):
        return
    for call in ctx.calls_named("GradScaler"):
        yield call, ""


def _deprecated_amp(ctx: Context):
    """`torch.cuda.amp.*`, also through an import (`import torch.cuda.amp as amp`, `from
    torch.cuda import amp`, `from torch.cuda.amp import autocast`: `amp.autocast()`) —
    not where it is the fallback for an older torch (`except ImportError/AttributeError:`,
    a branch of a version or `hasattr` check), at the use or at the import. A use through
    an import is reported at its call (not its callable), which `--fix` leaves alone: its
    rewrite spells out `torch.…`, which the file may not have imported."""
    if "amp" not in ctx.source:  # (every name it looks for, and their imports, say it)
        return
    aliases = _old_amp_aliases(ctx)
    for node in ctx.of(ast.Attribute, ast.Name):
        name = dotted(node)
        if name in DEPRECATED_AMP:
            if not old_torch_fallback(ctx, node):
                yield node, f"(`{name}`)"
            continue
        root, _, rest = name.partition(".")
        if root not in aliases or isinstance(ctx.parents.get(node), ast.Attribute) or \
                not isinstance(node.ctx, ast.Load):
            continue  # `amp` of `amp.autocast`: judged at the whole name
        origin = f"{aliases[root]}.{rest}" if rest else aliases[root]
        if origin in DEPRECATED_AMP and not old_torch_fallback(ctx, node):
            call = ctx.parents.get(node)
            yield (call if isinstance(call, ast.Call) and call.func is node else node,
                   f"(`{name}`: `{origin}`)")


def _old_amp_aliases(ctx: Context) -> dict[str, str]:
    """Local names bound by an import to `torch.cuda.amp` or one of its members: name →
    what it is, when every import of the name is that one and none is a fallback."""
    found: dict[str, set[str]] = {}
    fallback: set[str] = set()
    for node in ctx.of(ast.Import, ast.ImportFrom):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                origin = alias.name if isinstance(node, ast.Import) and alias.asname else \
                    f"{node.module}.{alias.name}" if isinstance(node, ast.ImportFrom) else ""
                found.setdefault(local, set()).add(origin)
                if old_torch_fallback(ctx, node):
                    fallback.add(local)
    return {local: origins.pop() for local, origins in found.items() if len(origins) == 1
            and local not in fallback and next(iter(origins)).startswith("torch.cuda.amp")}


def old_torch_fallback(ctx: Context, node: ast.AST) -> bool:
    """`node` is in code for an older torch: an `except ImportError/AttributeError:`
    handler, or a branch of an `if` that asks for the torch version or `hasattr`."""
    for parent in ctx.ancestors(node):
        if isinstance(parent, ast.ExceptHandler) and parent.type is not None and {
                last(dotted(n)) for n in walk(parent.type)} & OLD_TORCH_ERRORS:
            return True
        if isinstance(parent, (ast.If, ast.IfExp)) and node is not parent.test and \
                _version_test(parent.test):
            return True
    return False


def _version_test(test: ast.AST) -> bool:
    for n in walk(test):
        if isinstance(n, ast.Call) and last(dotted(n)) == "hasattr":
            return True
        name = n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")
        if "version" in name.lower():
            return True
    return False


RULES = [
    Rule("PX601", "error", "Gradient clipping before `scaler.unscale_(optimizer)`.",
         "Call `scaler.unscale_(opt)` first, then clip, then `scaler.step(opt)`.",
         "scaler = torch.amp.GradScaler()\nscaler.scale(loss).backward()\n"
         "clip_grad_norm_(model.parameters(), 1.0)  # <-\nscaler.step(opt)",
         "scaler = torch.amp.GradScaler()\nscaler.scale(loss).backward()\n"
         "scaler.unscale_(opt)\nclip_grad_norm_(model.parameters(), 1.0)\nscaler.step(opt)",
         _clip_before_unscale),
    Rule("PX602", "warning", "A GradScaler with bf16: bf16 has fp32's range, loss scaling only "
         "costs time.", "Drop the GradScaler with `dtype=torch.bfloat16` (keep it for fp16).",
         "scaler = torch.amp.GradScaler()  # <-\n"
         "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)",
         "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)",
         _scaler_with_bf16),
    Rule("PX603", "warning", "The deprecated `torch.cuda.amp` API.",
         "Use `torch.autocast('cuda', ...)` and `torch.amp.GradScaler('cuda')`.",
         "scaler = torch.cuda.amp.GradScaler()  # <-",
         "scaler = torch.amp.GradScaler('cuda')", _deprecated_amp),
]
