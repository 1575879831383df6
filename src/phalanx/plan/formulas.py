"""The planner's arithmetic: plain functions, one term each, the formula in the docstring.

Notation: B micro-batch, T sequence length (block size), C width (n_embd), L blocks,
H heads, V vocabulary, W data-parallel ranks, N parameters, s bytes per element.
Bytes are per rank. Everything is checked against hand-computed values in
tests/unit/test_plan_formulas.py and against torch's memory tracker by
`phalanx plan --measure`.
"""

from __future__ import annotations

import math

from phalanx.models.shapes import (  # noqa: F401 - the planner's terms
    MiniGPTShapes,
    minigpt_layout,
    minigpt_matmul_params,
    minigpt_param_shapes,
    numel,
)

FP32 = 4
INDEX = 8  # int64 token ids


def shard_numel(shape: tuple[int, ...], W: int) -> int:
    """One rank's share of a parameter FSDP2 shards on dim 0: ⌈d0 / W⌉ · (numel / d0)
    (dim 0 is padded to a multiple of W)."""
    if not shape:
        return 1
    return math.ceil(shape[0] / W) * (numel(shape) // shape[0])


def param_bytes(shapes: list[tuple[int, ...]], W: int = 1, sharded: bool = False,
                s: int = FP32) -> int:
    """Σ numel · s (replicated), or Σ ⌈d0/W⌉·(numel/d0) · s (sharded on dim 0)."""
    return sum((shard_numel(p, W) if sharded else numel(p)) * s for p in shapes)


def gathered_bytes(shapes: list[tuple[int, ...]], W: int = 1, s: int = FP32) -> int:
    """What FSDP2's all-gather of these parameters allocates (and its reduce-scatter
    takes): every rank's ⌈d0/W⌉-row shard, Σ W · ⌈d0/W⌉ · (numel/d0) · s — dim 0 padded
    to a multiple of W (more than the parameters once W exceeds a dim, e.g. 768 rows at
    W = 1,024)."""
    return sum(W * shard_numel(p, W) * s for p in shapes)


def adamw_state_bytes(param_bytes_held: int) -> int:
    """AdamW keeps exp_avg and exp_avg_sq per parameter element it updates, in the
    parameter's dtype: 2 · (bytes of the parameters this rank updates). (The per-tensor
    `step` counters are a few bytes each and left out.)"""
    return 2 * param_bytes_held


ADAMW_COPIES, MUON_COPIES = 2, 1  # state tensors per parameter element


def optimizer_state_bytes(shapes: list[tuple[int, ...]], copies: list[int], W: int = 1,
                          sharded: bool = False, s: int = FP32) -> int:
    """Σ copies · numel · s over the parameters this rank updates (each sharded on dim 0
    when `sharded`, as FSDP keeps its state): AdamW keeps 2 copies (exp_avg, exp_avg_sq),
    Muon 1 (its momentum buffer), in the parameter's dtype. (The per-tensor `step`
    counters are a few bytes each and left out.)"""
    return sum(c * (shard_numel(p, W) if sharded else numel(p)) * s
               for p, c in zip(shapes, copies, strict=True))


def step_temporaries(shapes: list[tuple[int, ...]], muon: list[bool],
                     order: list[list[int]], W: int = 1, s: int = FP32) -> int:
    """The most a per-parameter optimizer step (Phalanx's MuonAdamW) holds at once beyond
    its state. It walks `order` (each group's parameter indices in step order); at each
    parameter: its own temporaries plus the previous parameter's result, which the loop
    still references until it rebinds it. AdamW's single-tensor step makes 2·|p| (the
    square root, then its division: the denominator), beside the previous denominator.
    Muon orthogonalises the whole m×n matrix (m ≤ n; under FSDP gathered from its W
    update shards): the update, the normalised matrix, the Gram matrix, its product and
    the next iterate, |u| + (2mn + 2m²)·4, beside the previous orthogonalised update
    (m·n·s). `W` > 1: the parameters are FSDP shards."""
    peak = 0
    for members in order:
        previous = 0
        for i in members:
            if muon[i]:
                m, n = sorted((shapes[i][0], numel(shapes[i]) // shapes[i][0]))
                update = m * n * s + (shard_numel(shapes[i], W) * s if W > 1 else 0)
                own, result = update + (2 * m * n + 2 * m * m) * FP32, m * n * s
            else:
                own, result = 2 * shard_numel(shapes[i], W) * s, shard_numel(shapes[i], W) * s
            peak = max(peak, previous + own)
            previous = result
    return peak


def zero_assignment(shapes: list[tuple[int, ...]], W: int,
                    groups: list[int] | None = None) -> list[int]:
    """The rank ZeroRedundancyOptimizer gives each parameter: torch's
    `_partition_parameters` walks the parameter groups in order and, within a group, the
    parameters largest first (ties in their order), each to the rank holding the fewest
    elements so far (the counts carried from group to group). `groups`: each parameter's
    group (default: one group)."""
    groups = groups or [0] * len(shapes)
    loads, rank_of = [0] * W, [0] * len(shapes)
    for g in sorted(set(groups)):
        members = [i for i in range(len(shapes)) if groups[i] == g]
        for i in sorted(members, key=lambda i: -numel(shapes[i])):
            rank_of[i] = loads.index(min(loads))
            loads[rank_of[i]] += numel(shapes[i])
    return rank_of


def zero_partition_bytes(shapes: list[tuple[int, ...]], W: int, rank: int = 0,
                         s: int = FP32, groups: list[int] | None = None) -> int:
    """ZeroRedundancyOptimizer's share (`zero_assignment`): the bytes of the parameters
    the rank-th fullest rank updates."""
    rank_of = zero_assignment(shapes, W, groups)
    loads = [sum(numel(p) for p, r in zip(shapes, rank_of) if r == k) for k in range(W)]
    return sorted(loads, reverse=True)[rank] * s


def zero_state_bytes(shapes: list[tuple[int, ...]], copies: list[int], W: int,
                     groups: list[int] | None = None, s: int = FP32) -> int:
    """The largest optimizer state a rank holds under ZeRO: Σ copies · numel · s over the
    parameters `zero_assignment` gives it (the partition balances elements, not state:
    with Muon's 1 copy beside AdamW's 2, the fullest rank by elements need not hold the
    most state)."""
    return max(zero_rank_states(shapes, copies, W, groups, s))


def zero_rank_states(shapes: list[tuple[int, ...]], copies: list[int], W: int,
                     groups: list[int] | None = None, s: int = FP32) -> list[int]:
    """Each rank's optimizer state under ZeRO, rank by rank: Σ copies · numel · s over the
    parameters `zero_assignment` gives it."""
    rank_of = zero_assignment(shapes, W, groups)
    return [sum(c * numel(p) * s for p, c, r in zip(shapes, copies, rank_of) if r == k)
            for k in range(W)]


def minigpt_block_activations(B: int, T: int, C: int, H: int, s: int = FP32) -> int:
    """Bytes one block saves for backward (no dropout, SDPA's fused kernel), with every
    tensor s bytes (fp32; or bf16/fp16 parameters, as FSDP's mixed precision gathers
    them): 16·B·T·C·s — block input and LayerNorm out (1+1), qkv (3), attention out (1, which
    the projection also saves: one tensor), residual after attention and LayerNorm out
    (1+1), MLP up and GELU out (4+4) — plus 2·2·B·T·4 (two LayerNorms' fp32 mean and
    rstd) and B·H·T·4 (SDPA's fp32 log-sum-exp)."""
    return 16 * B * T * C * s + 2 * 2 * B * T * FP32 + B * H * T * FP32


def minigpt_block_activations_autocast(B: int, T: int, C: int, H: int,
                                       block_params: int, s: int = 2) -> int:
    """One block under autocast with fp32 parameters (ddp, zero with bf16/fp16): the
    residual stream stays fp32 — block input and residual after attention 2·B·T·C·4 —
    while the matmuls' inputs and outputs are s-byte copies, 14·B·T·C·s (LayerNorm outs
    1+1, qkv 3, attention out 1, MLP up 4, GELU out 4); autocast's s-byte copies of the
    block's weights are saved too (block_params·s); LayerNorm stats and log-sum-exp as
    in fp32."""
    return (2 * B * T * C * FP32 + 14 * B * T * C * s + block_params * s
            + 2 * 2 * B * T * FP32 + B * H * T * FP32)


def attention_option_activations(B: int, T: int, C: int, H: int, s: int = FP32, *,
                                 rope: bool = False, qk_norm: bool = False) -> int:
    """What rotary positions and QK-norm add to a block's saved tensors (measured with
    autograd's saved-tensor hooks): SDPA saves new queries and keys instead of views of the
    qkv output (which stays alive through v), and its output no longer has the layout the
    projection reads, which saves a contiguous copy: 3·B·T·C·s. QK-norm also saves its
    fp32 rstd per head and position, 2·B·H·T·4, and with s-byte queries and keys (it
    normalises in fp32) its fp32 copies of them, 2·B·T·C·4. Rotary positions on s-byte
    queries and keys save s-byte copies of the fp32 cos/sin tables, 2·T·(C/H)·s (two
    T×(C/H)/2 tables for each of q and k)."""
    if not (rope or qk_norm):
        return 0
    out = 3 * B * T * C * s
    if qk_norm:
        out += 2 * B * H * T * FP32 + (2 * B * T * C * FP32 if s < FP32 else 0)
    if rope and s < FP32:
        out += 2 * T * (C // H) * s
    return out


def rope_buffers(L: int, T: int, C: int, H: int) -> int:
    """The rotation tables every block holds as fp32 buffers (not parameters, never
    sharded): cos and sin, T×(C/H)/2 each, L·T·(C/H)·4."""
    return L * T * (C // H) * FP32


def softcap_activations(B: int, T: int, V: int) -> int:
    """The logit soft-cap c·tanh(logits/c) runs in fp32 and saves tanh's output,
    B·T·V·4 (the capped fp32 logits are what the caller then holds)."""
    return B * T * V * FP32


def minigpt_head_activations_autocast(B: int, T: int, C: int, V: int, s: int = 2) -> int:
    """After the blocks under autocast: ln_f's fp32 input B·T·C·4 and s-byte output
    B·T·C·s, the s-byte copy of the tied output weight V·C·s, the fp32 log-softmax
    B·T·V·4, stats 2·B·T·4 and the ids 2·B·T·8."""
    return (B * T * C * FP32 + B * T * C * s + V * C * s + B * T * V * FP32
            + 2 * B * T * FP32 + 2 * B * T * INDEX)


def minigpt_head_activations(B: int, T: int, C: int, V: int, s: int = FP32) -> int:
    """Bytes saved after the blocks (s as for the block): ln_f's input and output
    2·B·T·C·s, its mean/rstd
    2·B·T·4, the fp32 log-softmax of the loss B·T·V·4, and the token ids and targets
    2·B·T·8."""
    return 2 * B * T * C * s + 2 * B * T * FP32 + B * T * V * FP32 + 2 * B * T * INDEX


def head_backward_transient(B: int, T: int, C: int, V: int) -> int:
    """In fp32, what the head's backward holds beyond the saved tensors: the V×C weight
    gradient as its matmul makes it, before it lands in `.grad` (DDP's bucket), and the
    input's gradient B·T·C — 4 bytes each. (The logits' gradient, B·T·V·4, takes the place
    of the loss's log-softmax that its backward has freed: counted as that saved tensor.)"""
    return (V * C + B * T * C) * FP32


def minigpt_activations(B: int, T: int, C: int, H: int, V: int, L: int, s: int = FP32,
                        checkpointed: bool = False) -> int:
    """Bytes saved by one micro-batch's forward: L·block + head; with activation
    checkpointing each block keeps only its input, L·B·T·C·s."""
    per_block = B * T * C * s if checkpointed else minigpt_block_activations(B, T, C, H, s)
    return L * per_block + minigpt_head_activations(B, T, C, V, s)


def mlp_backward_in_flight(B: int, T: int, C: int, s: int = FP32) -> int:
    """A block's peak inside its backward, at the MLP down-projection: the gradient
    coming in (B·T·C·s), the one it produces for the 4C-wide hidden layer (4·B·T·C·s),
    and its weight's gradient (4·C²·s)."""
    return 5 * B * T * C * s + 4 * C * C * s


def mlp_forward_transient(B: int, T: int, C: int, s: int = FP32, s_stream: int = FP32) -> int:
    """A block's forward that saves nothing (activation checkpointing) holds at most its
    MLP's up-projection and GELU outputs (4+4)·B·T·C·s and the residual stream
    B·T·C·s_stream at once."""
    return 8 * B * T * C * s + B * T * C * s_stream


def ring_all_reduce_bytes(nbytes: int, W: int) -> float:
    """Bytes each rank sends in a ring all-reduce: 2·(W−1)/W · size."""
    return 2 * (W - 1) / W * nbytes


def ring_all_gather_bytes(nbytes: int, W: int) -> float:
    """Bytes each rank sends in a ring all-gather (or reduce-scatter) of a tensor of
    `nbytes` in all: (W−1)/W · size."""
    return (W - 1) / W * nbytes


def compute_seconds(flops_per_token: float, tokens: int, peak_flops: float,
                    mfu: float) -> float:
    """Step compute time: flops_per_token · tokens / (peak FLOP/s · MFU)."""
    return flops_per_token * tokens / (peak_flops * mfu)


def minigpt_flops_per_token(N_non_embedding: int, L: int, H: int, C: int, T: int) -> int:
    """Training FLOPs per token (PaLM appendix B, the bench's formula): 6·N + 12·L·H·Q·T
    with Q = C/H."""
    return 6 * N_non_embedding + 12 * L * H * (C // H) * T


def newton_schulz_flops(shape: tuple[int, ...], steps: int = 5) -> int:
    """Muon's orthogonalisation of one m×n update (m ≤ n: it runs on the wide side), per
    optimizer step: each step's X·Xᵀ 2·m²·n, A·A 2·m³ and B·X 2·m²·n,
    steps · (4·m²·n + 2·m³)."""
    m, n = sorted(shape)
    return steps * (4 * m * m * n + 2 * m ** 3)


def exposed_seconds(comm_s: float, backward_s: float, overlap: float) -> float:
    """Communication left on the critical path when a share `overlap` of the backward
    pass can hide it: max(0, comm − overlap · backward)."""
    return max(0.0, comm_s - overlap * backward_s)
