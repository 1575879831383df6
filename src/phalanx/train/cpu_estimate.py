"""Before a large model starts on CPU: how long a step will take, said up front.

The estimate is a floor: the model's training FLOPs per step per rank (6·N + 12·L·C·T per
token, N the matrix-multiply parameters) over the speed of a square fp32 matmul measured
here with the rank's threads (~0.2 s) — a training step never runs faster than its
matmuls do.
"""

from __future__ import annotations

import time

from phalanx.config.data_spec import UNKNOWN_VOCAB_FALLBACK, vocab_size_of
from phalanx.config.sections import Config
from phalanx.models.shapes import minigpt_matmul_params

WARN_ABOVE_S = 5.0  # per step


def flops_per_step(cfg: Config, vocab_size: int | None = None) -> float:
    """Training FLOPs of one optimizer step on one rank, for the tokenizer's vocabulary
    (`vocab_size`; default: what `--tokenizer` implies, 256 when a file can't be read)."""
    m, t = cfg.model, cfg.train
    V = vocab_size or vocab_size_of(cfg.data.tokenizer, cfg.data.path) or UNKNOWN_VOCAB_FALLBACK
    n = minigpt_matmul_params(m.n_layer, m.n_embd, V, m.block_size, m.bias, rope=m.rope,
                              tied=m.tie_embeddings)  # without the positions
    per_token = 6.0 * n + 12.0 * m.n_layer * m.n_embd * m.block_size
    return per_token * t.micro_batch_size * t.grad_accum * m.block_size


def matmul_flops(threads: int, size: int = 512, budget_s: float = 0.2) -> float:
    """FLOP/s of a `size`² fp32 matmul on `threads` threads, the best of ~`budget_s`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size)
        best, spent = float("inf"), 0.0
        while spent < budget_s:
            t0 = time.perf_counter()
            a @ a
            took = time.perf_counter() - t0
            best, spent = min(best, took), spent + took
    finally:
        torch.set_num_threads(before)
    return 2.0 * size**3 / best


def cpu_warning(cfg: Config, threads: int, vocab_size: int | None = None) -> str | None:
    """The note for a model whose steps will be slow on this CPU, or None (also for a
    `--model` factory's module: its FLOPs are not known before it is built)."""
    if cfg.model.factory is not None:
        return None
    work = flops_per_step(cfg, vocab_size)
    if work / 1e12 < 0.5:  # under 0.5 TFLOP a step: no measurement needed
        return None
    speed = matmul_flops(threads)
    seconds = work / speed
    if seconds < WARN_ABOVE_S:
        return None
    total = seconds * cfg.train.max_steps
    m = cfg.model
    return (f"note: MiniGPT {m.n_layer}L × {m.n_embd}d, block {m.block_size}, on CPU: at least "
            f"{_span(seconds)} per step ({work / 1e12:.1f} TFLOP per step per rank; this "
            f"machine's matmuls run at {speed / 1e9:.0f} GFLOP/s with {threads} thread(s)), so "
            f"{cfg.train.max_steps} steps take at least {_span(total)}. It runs, but this is "
            f"a model for a GPU; `--preset tiny` or `--preset small` train here in minutes.")


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
