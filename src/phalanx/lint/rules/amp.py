"""Mixed precision: GradScaler order, GradScaler with bf16, the deprecated API."""

from __future__ import annotations

import ast

from phalanx.lint.engine import Context, Rule, calls_in, dotted, last
from phalanx.lint.facts import old_torch_fallback


def _scalers(ctx: Context) -> set[str]:
    """Names bound to a GradScaler (`scaler`, `self.scaler`)."""
    return {dotted(target) for node in ctx.nodes if isinstance(node, ast.Assign)
            and any(isinstance(n, ast.Call) and dotted(n).endswith("GradScaler")
                    for n in ast.walk(node.value))  # also `GradScaler() if amp else None`
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
        if scaled and not any(dotted(c).endswith("unscale_") for c in before):
            yield clip, "(the gradients it clips are still multiplied by the loss scale)"


def _scaler_with_bf16(ctx: Context):
    if "bfloat16" not in ctx.source or "float16" in ctx.source.replace("bfloat16", ""):
        return
    for call in ctx.calls_named("GradScaler"):
        yield call, ""


def _deprecated_amp(ctx: Context):
    """`torch.cuda.amp.*` — not where it is the fallback for an older torch (`except
    ImportError/AttributeError:`, a branch of a version or `hasattr` check)."""
    for node in ctx.nodes:
        if isinstance(node, ast.Attribute) and dotted(node) in (
                "torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler") \
                and not old_torch_fallback(ctx, node):
            yield node, f"(`{dotted(node)}`)"


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
