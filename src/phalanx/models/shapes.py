"""MiniGPT's parameter shapes from its config numbers alone (no torch): what the planner and
the trainer's CPU estimate count."""

from __future__ import annotations

import math


def minigpt_param_shapes(L: int, C: int, V: int, T: int, bias: bool) -> list[tuple[int, ...]]:
    """Every parameter's shape, in order (the lm_head shares wte's weight: counted once).

    Per block: LayerNorm C (+C bias), attention qkv 3C×C (+3C) and projection C×C (+C),
    LayerNorm C (+C), MLP 4C×C (+4C) and C×4C (+C). Then wte V×C, wpe T×C, ln_f C (+C).
    """
    def ln() -> list[tuple[int, ...]]:
        return [(C,), (C,)] if bias else [(C,)]

    def linear(out: int, inp: int) -> list[tuple[int, ...]]:
        return [(out, inp), (out,)] if bias else [(out, inp)]

    block = [*ln(), *linear(3 * C, C), *linear(C, C), *ln(), *linear(4 * C, C),
             *linear(C, 4 * C)]
    return [(V, C), (T, C), *block * L, *ln()]


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
