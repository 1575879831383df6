"""Learning-rate schedules: linear warm-up, then cosine decay to `min_lr` (GPT-2,
nanoGPT), or warm-up / stable / decay (`wsd`: the peak held, then a linear decay over
the last `decay_fraction` of the steps — the speedrun's schedule)."""

from __future__ import annotations

import math

SCHEDULES = ("cosine", "wsd")


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int,
          schedule: str = "cosine", decay_fraction: float = 0.3) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "wsd":
        start = max(warmup_steps, round(max_steps * (1.0 - decay_fraction)))
        if step < start:
            return lr
        progress = min(1.0, (step - start) / max(1, max_steps - start))
        return lr - progress * (lr - min_lr)
    span = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
