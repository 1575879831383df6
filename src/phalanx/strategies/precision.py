"""Mixed precision: `torch.autocast` for bf16/fp16, a loss scaler only for fp16.

The strategy makes the `Precision` (`Strategy.precision`): a sharded strategy needs a
scaler that agrees on overflow across gradient shards, and FSDP also gathers parameters
in `dtype` (its mixed-precision policy, set at wrap time).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    """The autocast context and (fp16 only) the loss scaler for one device.

    bf16 has fp32's exponent range, so its gradients do not underflow and need no
    scaler; fp16 does. Unscale happens before clipping (see `train.loop.optimizer_step`).
    """

    def __init__(self, name: str, device: torch.device) -> None:
        if name not in DTYPES:
            raise ValueError(f"precision must be one of {', '.join(DTYPES)}, got {name!r}")
        self.name, self.device = name, device
        self.dtype = DTYPES[name]
        self.scaler = self.make_scaler() if name == "fp16" else None

    def make_scaler(self):
        return torch.amp.GradScaler(self.device.type)

    def autocast(self) -> AbstractContextManager:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)
