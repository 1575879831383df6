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

# max |fused − math| / max |math| per tensor, same autocast dtype (not yet calibrated on
# a GPU: a broken kernel gives ~1; bf16 keeps 8 bits of mantissa, fp16 11)
KERNEL_TOL = {torch.bfloat16: 5e-2, torch.float16: 2e-2}


def attention_and_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        kernel: Callable[[], AbstractContextManager], dtype: torch.dtype
                        ) -> dict[str, torch.Tensor]:
    """One forward and backward of `model(x, y)` (MiniGPT: returns (logits, loss)) under
    `kernel()` and autocast to `dtype`: each CausalSelfAttention's output, each
    parameter's gradient and the loss, as fp32 on the CPU. The gradients are cleared."""
    from phalanx.models.minigpt import CausalSelfAttention

    found: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(module, args, out):
            found[f"attention {name}"] = out.detach().float().cpu()
        return hook

    hooks = [m.register_forward_hook(keep(n)) for n, m in model.named_modules()
             if isinstance(m, CausalSelfAttention)]
    try:
        with kernel(), torch.autocast(x.device.type, dtype=dtype):
            _, loss = model(x, y)
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    found.update({f"grad {n}": p.grad.detach().float().cpu()
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


def scaler_stuck(state: dict, initial_scale: float) -> str | None:
    """Why the fp16 loss scaler's final `state` (GradScaler.state_dict, as a checkpoint
    records it) shows it never acted, or None: a scaler that saw an overflow moved its
    scale (down, and maybe back up); one that never moved from `initial_scale` and
    counts no growth either did nothing."""
    scale = state.get("scale")
    if scale is None:
        return f"no scale in the scaler's state: {state}"
    if scale != initial_scale:
        return None
    return (f"the loss scale is still {initial_scale:g} (growth tracker "
            f"{state.get('_growth_tracker')}): no overflow skipped, no growth — the scaler "
            f"never acted")
