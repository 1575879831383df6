"""MiniGPT's parameter shapes from its config numbers alone (no torch): what the planner and
the trainer's CPU estimate count."""

from __future__ import annotations

import math
from dataclasses import dataclass

Shape = tuple[int, ...]


@dataclass(frozen=True)
class MiniGPTShapes:
    """MiniGPT's parameters in `model.parameters()` order, by where they sit: the
    embeddings before the blocks, one block (all L alike), and what follows the blocks."""
    embeddings: list[Shape]  # wte V×C, then wpe T×C (learned positions only)
    block: list[Shape]
    n_blocks: int
    tail: list[Shape]  # ln_f, then an untied lm_head V×C

    @property
    def all(self) -> list[Shape]:
        return [*self.embeddings, *self.block * self.n_blocks, *self.tail]

    @property
    def root(self) -> list[Shape]:
        """Outside the blocks (FSDP's root unit)."""
        return [*self.embeddings, *self.tail]


def minigpt_layout(L: int, C: int, V: int, T: int, bias: bool, *, rope: bool = False,
                   tied: bool = True) -> MiniGPTShapes:
    """Per block: LayerNorm C (+C bias), attention qkv 3C×C (+3C) and projection C×C (+C),
    LayerNorm C (+C), MLP 4C×C (+4C) and C×4C (+C). Before the blocks wte V×C and, without
    rotary positions (`rope`), wpe T×C; after them ln_f C (+C) and, untied, lm_head V×C
    (no bias). Tied, the lm_head shares wte's weight: counted once. QK-norm, the
    activation and the logit soft-cap have no parameters."""
    def ln() -> list[Shape]:
        return [(C,), (C,)] if bias else [(C,)]

    def linear(out: int, inp: int) -> list[Shape]:
        return [(out, inp), (out,)] if bias else [(out, inp)]

    block = [*ln(), *linear(3 * C, C), *linear(C, C), *ln(), *linear(4 * C, C),
             *linear(C, 4 * C)]
    embeddings: list[Shape] = [(V, C)] if rope else [(V, C), (T, C)]
    tail = [*ln(), *([] if tied else [(V, C)])]
    return MiniGPTShapes(embeddings, block, L, tail)


def minigpt_param_shapes(L: int, C: int, V: int, T: int, bias: bool, *, rope: bool = False,
                         tied: bool = True) -> list[Shape]:
    """Every parameter's shape, in `model.parameters()` order (`minigpt_layout`)."""
    return minigpt_layout(L, C, V, T, bias, rope=rope, tied=tied).all


def minigpt_matmul_params(L: int, C: int, V: int, T: int, bias: bool, *, rope: bool = False,
                          tied: bool = True) -> int:
    """N of the FLOP formula: every parameter but the position table (the tied head's
    weight counts once, as nanoGPT counts it)."""
    n = sum(map(numel, minigpt_param_shapes(L, C, V, T, bias, rope=rope, tied=tied)))
    return n if rope else n - T * C


def numel(shape: Shape) -> int:
    return math.prod(shape)
