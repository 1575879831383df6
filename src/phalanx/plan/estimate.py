"""Per-rank memory of one training step, per strategy, from the model's shape.

The peak of a step is the largest of a few moments (each a sum of formulas.py terms):
  - backward starts: every saved activation, the logits the caller holds, and the loss's
    two B·T·V gradients;
  - block j's backward, at its MLP down-projection (k = L-1-j blocks done, the head's
    tensors freed): the saved tensors of blocks 0..j (with activation checkpointing: the
    inputs of blocks 0..j-1 and block j recomputed), the logits, and the gradients in
    flight inside the block; under FSDP also the sharded gradients of the k blocks done
    and the collectives' buffers in flight;
  - with activation checkpointing, the last block's forward: every block's input, and
    under autocast the weight copies its cast cache keeps until forward ends;
  - the optimizer step: parameters, gradients, optimizer state, the logits.
Around them, what each strategy holds per rank: DDP full parameters, its gradient buckets
(the gradients are views into them) and full optimizer state; ZeRO the same with
optimizer state for its share of the parameters only; FSDP a 1/W shard of parameters,
gradients and optimizer state, plus the root's parameters gathered for the whole step,
the block being computed gathered (every block, kept since forward, without
reshard-after-forward), the next block gathered ahead and the previous block's full
gradients waiting for their reduce-scatter.

Checked against torch's memory tracker by `phalanx plan --measure` and
benchmarks/plan_vs_measured.py (docs/plan.md holds the table).
"""

from __future__ import annotations

from dataclasses import dataclass

from phalanx.config.strategy import spec
from phalanx.plan import formulas as f

COMPONENTS = ("parameters", "gradients", "optimizer", "activations", "communication")


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs of a model, per micro-batch (MiniGPT: `minigpt_facts`)."""
    param_shapes: list[tuple[int, ...]]  # every parameter once
    block_shapes: list[tuple[int, ...]]  # one block's parameters (FSDP's unit)
    root_shapes: list[tuple[int, ...]]  # parameters outside the blocks (FSDP's root)
    n_blocks: int
    block_saved: int  # bytes one block saves for backward
    block_input: int  # bytes of a block's input (all a checkpointed block keeps)
    head_saved: int  # bytes saved after the blocks (final norm, loss)
    logits: int  # the output the caller holds through backward and the step
    loss_grads: int  # the loss's gradients at the start of backward
    block_grads_in_flight: int  # gradients alive inside a block's backward, at its peak
    flops_per_token: int = 0
    tokens: int = 0
    gathered: int = f.FP32  # bytes per element of FSDP's gathered (unsharded) parameters
    reduced: int = f.FP32  # bytes per element of FSDP's gradients before reduce-scatter
    cast_cache: int = 0  # autocast's copies of one block's weights, kept to forward's end
    block_forward_peak: int = 0  # what a block's forward holds at once when it saves nothing


def minigpt_facts(L: int, H: int, C: int, T: int, V: int, B: int, bias: bool,
                  s: int = f.FP32, params_low: bool = False,
                  reduce_low: bool = False) -> ModelFacts:
    """MiniGPT's facts with s-byte activations: fp32 (s=4); s=2 under autocast with fp32
    parameters (ddp, zero: the residual stream stays fp32, weights are copied), or with
    s-byte parameters (`params_low`: FSDP's mixed precision gathers them in bf16/fp16;
    its gradients are reduced in fp32 unless `reduce_low`, --fsdp-bf16-reduce)."""
    shapes = f.minigpt_param_shapes(L, C, V, T, bias)
    per_block = (len(shapes) - 3 - (1 if bias else 0)) // L
    block = shapes[2:2 + per_block]
    autocast = s < f.FP32 and not params_low
    if autocast:
        block_saved = f.minigpt_block_activations_autocast(
            B, T, C, H, sum(map(f.numel, block)), s)
        head = f.minigpt_head_activations_autocast(B, T, C, V, s)
    else:
        block_saved = f.minigpt_block_activations(B, T, C, H, s)
        head = f.minigpt_head_activations(B, T, C, V, s)
    non_embedding = sum(f.numel(p) for p in shapes) - T * C
    return ModelFacts(
        shapes, block, shapes[:2] + shapes[2 + L * per_block:], L,
        block_saved=block_saved, block_input=B * T * C * (f.FP32 if autocast else s),
        head_saved=head, logits=B * T * V * s, loss_grads=2 * B * T * V * f.FP32,
        block_grads_in_flight=f.mlp_backward_in_flight(B, T, C, s),
        flops_per_token=f.minigpt_flops_per_token(non_embedding, L, H, C, T), tokens=B * T,
        gathered=s if params_low else f.FP32,
        reduced=s if params_low and reduce_low else f.FP32,
        cast_cache=sum(map(f.numel, block)) * s if autocast else 0,
        block_forward_peak=f.mlp_forward_transient(B, T, C, s,
                                                   f.FP32 if autocast else s))


@dataclass(frozen=True)
class Variant:
    label: str  # ddp, zero, fsdp, fsdp (no reshard)
    strategy: str
    reshard: bool = True

    @property
    def shards(self) -> frozenset[str]:
        """What one rank holds 1/W of (the strategy's spec): of parameters, gradients and
        optimizer state."""
        return spec(self.strategy).shards

    @property
    def sharded(self) -> bool:
        """Parameters split across ranks (gathered per block as they are used)."""
        return "parameters" in self.shards


VARIANTS = (Variant("ddp", "ddp"), Variant("zero", "zero"), Variant("fsdp", "fsdp"),
            Variant("fsdp (no reshard)", "fsdp", reshard=False))


def moments(facts: ModelFacts, variant: Variant, W: int, checkpointed: bool,
            s: int = f.FP32) -> dict[str, dict[str, int]]:
    """{moment: {component: bytes}} for the step's candidate peaks (see the module doc):
    backward start, each block's backward (k blocks already done), the optimizer step.

    FSDP's parameters in use (the root, and blocks gathered and entered) count as
    parameters; buffers of collectives in flight (`_fsdp_in_flight`) as communication."""
    P = f.param_bytes(facts.param_shapes, s=s)
    L = facts.n_blocks
    sharded = variant.sharded
    shard = f.param_bytes(facts.param_shapes, W, sharded=True, s=s)
    block = f.param_bytes(facts.block_shapes, s=facts.gathered)
    block_shard = f.param_bytes(facts.block_shapes, W, sharded=True, s=s)
    if sharded:
        base = {"parameters": shard + f.param_bytes(facts.root_shapes, s=facts.gathered),
                "gradients": 0,
                "optimizer": f.adamw_state_bytes(shard), "communication": 0}
    else:
        state = f.zero_partition_bytes(facts.param_shapes, W, s=s) \
            if "optimizer" in variant.shards else P
        base = {"parameters": P, "gradients": P, "optimizer": f.adamw_state_bytes(state),
                "communication": 0}
    per_block = facts.block_input if checkpointed else facts.block_saved
    saved = L * per_block + facts.head_saved
    kept = L if sharded and not variant.reshard else 0  # blocks gathered since forward
    out = {"backward start": {
        **base, "parameters": base["parameters"] + kept * block,
        "communication": block if sharded and variant.reshard else 0,
        "activations": saved + facts.logits + facts.loss_grads}}
    for k in range(L if facts.block_saved else 0):  # block L-1-k's backward, k blocks
        # done, the head's tensors freed (known for MiniGPT; a traced model: not)
        if checkpointed:  # earlier blocks' inputs, this block recomputed
            alive = (L - 1 - k) * facts.block_input + facts.block_saved
        else:  # this block's and the earlier blocks' saved tensors
            alive = (L - k) * facts.block_saved
        in_use = (L - k) if kept else 1
        out[f"block {L - 1 - k} backward"] = {
            **base, "parameters": base["parameters"] + (in_use * block if sharded else 0),
            "gradients": base["gradients"] + (k * block_shard if sharded else 0),
            "communication": _fsdp_in_flight(facts, variant, k) if sharded else 0,
            "activations": alive + facts.logits + facts.block_grads_in_flight}
    if checkpointed:  # the last block's forward: every block's input kept, and under
        # autocast its weight copies too (the cast cache lives until forward ends)
        out["forward, last block"] = {
            **base, "parameters": base["parameters"] + (block if sharded else 0),
            "activations": L * (facts.block_input + facts.cast_cache)
            + facts.block_forward_peak}
    out["optimizer step"] = {**base, "gradients": shard if sharded else base["gradients"],
                             "activations": facts.logits}
    return out


def _fsdp_in_flight(facts: ModelFacts, variant: Variant, k: int) -> int:
    """FSDP buffers in flight during block L-1-k's backward: the next block's parameters
    gathered ahead (backward prefetch; none after the first block, none when blocks stay
    gathered since forward) and the previous block's full gradients, in the reduce
    dtype, waiting for their reduce-scatter (from the second block on)."""
    L = facts.n_blocks
    gathered = f.param_bytes(facts.block_shapes, s=facts.gathered)
    prefetch = gathered if variant.reshard and k < L - 1 else 0
    return prefetch + (f.param_bytes(facts.block_shapes, s=facts.reduced) if k >= 1 else 0)


def peak(facts: ModelFacts, variant: Variant, W: int, checkpointed: bool,
         s: int = f.FP32) -> dict:
    """{component: bytes at the peak moment, "peak": their sum, "moment": which one}."""
    found = moments(facts, variant, W, checkpointed, s)
    name, parts = max(found.items(), key=lambda kv: sum(kv[1].values()))
    return {**{c: parts[c] for c in COMPONENTS}, "peak": sum(parts.values()), "moment": name}
