"""The trainer's optimizers: AdamW with decoupled weight decay on matrices only, fused where
torch has a kernel; or Muon + AdamW (`runtime.muon`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from phalanx.config.sections import Config


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


def make_optimizer(cfg: Config, model: nn.Module, params: Iterable[nn.Parameter],
                   device: torch.device, vocab_size: int | None = None) -> torch.optim.Optimizer:
    """The config's optimizer (`--optimizer`) over `params` (the wrapped model's): AdamW,
    or Muon on `model`'s hidden matrices with AdamW for the rest (`runtime.muon`)."""
    t = cfg.train
    if t.optimizer == "muon":
        from phalanx.runtime.muon import muon_adamw

        return muon_adamw(model, params, lr=t.lr, muon_lr=t.muon_lr,
                          weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                          vocab_size=vocab_size)
    return adamw(params, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                 device=device)
