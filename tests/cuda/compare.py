"""The CUDA tier's comparisons, device-agnostic so that each is shown catching a planted
broken kernel on the CPU (tests/unit/test_cuda_comparisons.py): a fused attention kernel
against the math kernel — every attention module's output and every gradient, not the
loss (zeroing the attention output of a freshly initialised model moves its loss by
0.015 %) — and the fp16 loss scaler, which must have moved."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn as nn

# max |fused − math| / max |math| per tensor, same autocast dtype (a broken kernel gives
# ~1; bf16 keeps 8 bits of mantissa, fp16 11). First H200 run (2026-11-27): bf16 worst
# 0.012 (flash) and 0.011 (efficient)
KERNEL_TOL = {torch.bfloat16: 5e-2, torch.float16: 2e-2}
# fp16 runs under a loss scale, as GradScaler runs it: unscaled, gpt2-124m's logit
# gradients (~1/(B·T·V) ≈ 5e-9) fall below fp16's smallest subnormal (6e-8), and on the
# first H200 run both kernels' gradients were then off each other by 3–4.7 %
LOSS_SCALE = {torch.float16: 2.0 ** 16}


def attention_and_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        kernel: Callable[[], AbstractContextManager], dtype: torch.dtype
                        ) -> dict[str, torch.Tensor]:
    """One forward and backward of `model(x, y)` (MiniGPT: returns (logits, loss)) under
    `kernel()` and autocast to `dtype`: each CausalSelfAttention's output, each
    parameter's gradient and the loss, as fp32 on the CPU. The gradients are cleared.
    fp16's backward runs on the loss × LOSS_SCALE (as GradScaler's), the gradients are
    divided by it again."""
    from phalanx.models.minigpt import CausalSelfAttention

    found: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module, args, out):
            found[f"attention {name}"] = out.detach().float().cpu()
        return hook

    scale = LOSS_SCALE.get(dtype, 1.0)
    hooks = [m.register_forward_hook(keep(n)) for n, m in model.named_modules()
             if isinstance(m, CausalSelfAttention)]
    try:
        with kernel(), torch.autocast(x.device.type, dtype=dtype):
            _, loss = model(x, y)
        (loss * scale).backward()
    finally:
        for h in hooks:
            h.remove()
    found.update({f"grad {n}": p.grad.detach().float().cpu() / scale
                  for n, p in model.named_parameters() if p.grad is not None})
    found["loss"] = loss.detach().float().cpu()
    model.zero_grad(set_to_none=True)
    return found


def relative_errors(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]
                    ) -> dict[str, float]:
    """max |got − ref| / max |ref| per tensor of `ref` (inf where `got` lacks it or its
    shape differs)."""
    out = {}
    for name, r in ref.items():
        g = got.get(name)
        if g is None or g.shape != r.shape:
            out[name] = float("inf")
            continue
        scale = r.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
        out[name] = float((g - r).abs().max() / scale)
    return out


def kernel_mismatches(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                      dtype: torch.dtype) -> list[str]:
    """The tensors (attention outputs, gradients, loss) where `got` is off `ref` by more
    than KERNEL_TOL[dtype], each with its relative error; [] when they agree."""
    tol = KERNEL_TOL[dtype]
    errors = relative_errors(got, ref)
    if not any(n.startswith("attention ") for n in ref):
        return ["no attention output was captured (no CausalSelfAttention ran)"]
    return [f"{n}: {e:.3g} > {tol:g}" for n, e in errors.items() if not e <= tol]


def scaler_stuck(state: dict, initial_scale: float, steps: int) -> str | None:
    """Why the fp16 loss scaler's final `state` (GradScaler.state_dict, as a checkpoint
    records it) after `steps` optimizer steps shows it never acted, or None: a scaler that
    saw an overflow moved its scale (down, and maybe back up); one still at
    `initial_scale` must have counted every step as overflow-free in its growth tracker
    (300 steps stay below torch's growth interval of 2000, as on the first H200 run); one
    that neither moved nor counted did nothing."""
    scale = state.get("scale")
    if scale is None:
        return f"no scale in the scaler's state: {state}"
    if scale != initial_scale or state.get("_growth_tracker") == steps:
        return None
    return (f"the loss scale is still {initial_scale:g} and its growth tracker is "
            f"{state.get('_growth_tracker')} after {steps} steps (expected {steps}: each "
            f"step without overflow counts one) — the scaler never acted")
