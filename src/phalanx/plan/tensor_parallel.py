"""The planner's tensor parallelism (`--tp T`, inside FSDP2): what one rank of a T-rank
tensor-parallel group holds of MiniGPT, as `models.minigpt.MiniGPT.tp_plan` splits it.

Parameters (no biases: `--bias` is not modelled): each block's attention output
projection and MLP down-projection split by rows, the MLP up-projection by columns,
`c_attn` and the norms whole; the token embedding (rows) and an untied head (columns) split over
the vocabulary when T divides it — else whole. FSDP then shards each rank's split over
the dp_shard ranks (estimate.moments at that width, on these local shapes).

Activations per block, in units of B·T·C·s: the block's input, the two LayerNorms'
outputs and the residual after attention (4) stay whole on every rank; the rank's heads
of c_attn's q, k, v output (3: as measured, the split by heads copies them out of the
whole output, which is then freed), the attention output (1), the MLP's up-projection and GELU outputs
(4 + 4) and, with rotary positions, the rotated queries and keys (2) are 1/T each. With
the vocabulary split the logits, the loss's log-softmax and its gradients are B·T·V/T per
rank, and torch's loss_parallel keeps one more B·T·V/T fp32 tensor than the unsplit loss
(measured with torch's memory tracker: `phalanx plan --tp 2 --dp-shard 2 --measure`).

Communication per block and micro-step (the TP group's, `tp_comm_bytes`, from the styles
of the plan): three all-reduces and one all-gather, none of which overlaps the matmuls
around it (counted as exposed). `--simulate` records these (at 1,024 ranks, the step's
communication within 0.4 % of the plan's: docs/plan.md).
"""

from __future__ import annotations

from dataclasses import replace

from phalanx.models.shapes import MiniGPTShapes, Shape, numel
from phalanx.plan import formulas as f
from phalanx.plan.estimate import optimizer_layout


def tp_refusal(cfg) -> str | None:
    """What the planner's TP model does not cover in `cfg` (None: it covers it), said as
    the option found — measured for MiniGPT in fp32 (AdamW or Muon) without these."""
    m, t = cfg.model, cfg.train
    found = [(m.factory is not None, "`--model` is your model (the plan traces it; its "
                                     "TP split is not traced yet)"),
             (t.precision != "fp32", f"`--precision {t.precision}` is not fp32"),
             (m.activation_checkpointing, "`--activation-checkpointing` is on"),
             (m.qk_norm, "`--qk-norm` is on"), (m.logit_softcap > 0, "`--logit-softcap` is on"),
             (m.bias, "`--bias` is on")]
    return next((why for hit, why in found if hit), None)


def local_layout(layout: MiniGPTShapes, tp: int, V: int, C: int) -> MiniGPTShapes:
    """`layout`'s shapes as one tensor-parallel rank holds them (no biases: `tp_refusal`)."""
    block = [(C,), (3 * C, C), (C, C // tp), (C,), (4 * C // tp, C), (C, 4 * C // tp)]
    vocab: Shape = (V // tp if V % tp == 0 else V, C)
    # wte first (wpe after it, whole); ln_f, then an untied head
    return MiniGPTShapes([vocab, *layout.embeddings[1:]], block, layout.n_blocks,
                         [layout.tail[0], *([vocab] if len(layout.tail) > 1 else [])])


def block_activations(B: int, T: int, C: int, H: int, tp: int, rope: bool, s: int = f.FP32
                      ) -> int:
    """Bytes one block saves for backward on one TP rank (the module doc's units), with the
    LayerNorms' fp32 statistics (whole) and SDPA's log-sum-exp for the rank's heads."""
    split = 3 + 1 + 8 + (2 if rope else 0)
    return (4 * B * T * C * s + split * B * T * C * s // tp
            + 2 * 2 * B * T * f.FP32 + B * (H // tp) * T * f.FP32)


def tp_facts(facts, cfg, tp: int, B: int, V: int):
    """`facts` (MiniGPT's, fp32, vocabulary V) as one tensor-parallel rank holds them."""
    m = cfg.model
    C, T, H = m.n_embd, m.block_size, m.n_head
    whole = f.minigpt_layout(m.n_layer, C, V, T, False, rope=m.rope, tied=m.tie_embeddings)
    local = local_layout(whole, tp, V, C)
    v = V // tp if V % tp == 0 else V
    copies, groups = optimizer_layout(local, v, cfg.train.optimizer)
    return replace(facts, param_shapes=local.all, block_shapes=local.block,
                   root_shapes=local.root,
                   block_saved=block_activations(B, T, C, H, tp, m.rope),
                   head_saved=f.minigpt_head_activations(B, T, C, v)
                   + (B * T * v * f.FP32 if v < V else 0),  # loss_parallel's own
                   logits=B * T * v * f.FP32, loss_grads=2 * B * T * v * f.FP32,
                   block_grads_in_flight=(B * T * C + 4 * B * T * C // tp
                                          + 4 * C * C // tp) * f.FP32,
                   head_grad=0, state_copies=copies, optim_groups=groups,
                   flops_per_token=flops_per_token(local, m, tp))


def flops_per_token(local: MiniGPTShapes, m, tp: int) -> int:
    """Training FLOPs per token on one TP rank (`formulas.minigpt_flops_per_token` on its
    split): 6 × the matrices it holds (c_attn whole: every rank computes all of q, k, v;
    the learned position table is a lookup) + attention over its n_head/T heads."""
    held = sum(map(numel, local.all)) - (0 if m.rope else m.block_size * m.n_embd)
    return f.minigpt_flops_per_token(held, m.n_layer, m.n_head // tp, m.n_embd // tp,
                                     m.block_size)


def tp_comm_bytes(cfg, tp: int, B: int, V: int) -> float:
    """Bytes one rank sends per micro-step in its TP group's collectives (ring): per block
    three all-reduces of B·T·C fp32 (the two row splits' outputs in forward, the MLP's
    column-split input gradient in backward) and one all-gather of the heads' q, k, v
    gradients, 3·B·T·C (back to c_attn, which is whole); with the vocabulary split, the
    embedding's output and the head's input gradient, two more all-reduces."""
    m = cfg.model
    act = B * m.block_size * m.n_embd * f.FP32
    reduces = 3 * m.n_layer + (2 if V % tp == 0 else 0)
    return (reduces * f.ring_all_reduce_bytes(act, tp)
            + m.n_layer * f.ring_all_gather_bytes(3 * act, tp))
