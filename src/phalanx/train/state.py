"""What the trainer carries from step to step (`TrainState`, all a checkpoint needs besides
the model, optimizer and scaler) and what it hands back (`TrainResult`). Torch is named
in annotations only: `train.checkpointing` imports this module without it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn as nn


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    position: int = 0  # global samples consumed (the data cursor)
    tokens_seen: int = 0
    corpus: dict | None = None  # what the cursor counts in (TokenSplits.corpus_record)


@dataclass
class TrainResult:
    model: nn.Module  # as wrapped by the strategy
    optimizer: torch.optim.Optimizer
    losses: list[float] = field(default_factory=list)  # global mean train loss per step
    val_losses: dict[int, float] = field(default_factory=dict)  # nats/token
    val_nats_per_byte: dict[int, float] = field(default_factory=dict)  # where bytes are known
    token_bytes: torch.Tensor | None = None  # each token id's length in bytes
    tokenizer: dict | None = None  # what checkpoints record of it (TokenSplits.tokenizer_record)
    state: TrainState = field(default_factory=TrainState)
    stopped: int = 0  # the signal (SIGINT/SIGTERM) that ended the loop early, or 0
    grad_norms: list = field(default_factory=list)  # per step, before clipping (floats once logged)
