"""AdamW with decoupled weight decay on matrices only, fused where torch has a kernel."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn


def adamw(params: Iterable[nn.Parameter], *, lr: float, weight_decay: float,
          betas: tuple[float, float], device: torch.device,
          fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW where 2-D+ tensors (weights, embeddings) decay and 1-D ones (norms, biases) don't.

    Fused (one kernel for all parameters, on CPU and CUDA) unless `fused=False`: torch's
    own default is a per-parameter loop on CPU and `foreach` on CUDA (`phalanx bench
    --defaults` measures the difference).
    """
    params = [p for p in params if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type in ("cpu", "cuda") if fused is None else fused
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)
