"""Per-rank memory of one training step, per strategy, from the model's shape.

The peak of a step is the largest of a few moments (each a sum of formulas.py terms):
  - backward starts: every saved activation, the logits the caller holds, and the loss's
    two B·T·V gradients;
  - the head's backward (ddp, zero; fp32): the saved tensors, the logits, and its weight's
    gradient as the matmul makes it (`formulas.head_backward_transient`);
  - block j's backward, at its MLP down-projection (k = L-1-j blocks done, the head's
    tensors freed): the saved tensors of blocks 0..j (with activation checkpointing: the
    inputs of blocks 0..j-1 and block j recomputed), the logits, and the gradients in
    flight inside the block; under FSDP also the sharded gradients of the k blocks done
    and the collectives' buffers in flight;
  - with activation checkpointing, the last block's forward: every block's input, and
    under autocast the weight copies its cast cache keeps until forward ends;
  - under FSDP, the root's reduce-scatter at the end of backward (`_root_reduce_scatter`);
  - the optimizer step: parameters, gradients, optimizer state, the logits, and for a
    per-parameter step (Muon's) the temporaries it makes (`step_optimizer_bytes`).
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

from dataclasses import dataclass, replace

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
    # optimizer state tensors per element of each parameter (param_shapes' order; empty:
    # AdamW's 2 for all) and each parameter's optimizer group (ZeRO partitions group by
    # group; empty: AdamW's two, matrices then vectors)
    state_copies: tuple[int, ...] = ()
    optim_groups: tuple[int, ...] = ()
    buffers: int = 0  # bytes of buffers every rank holds whole (rotary tables)
    grad_accum: int = 1  # micro-steps per optimizer step (`--grad-accum`)
    grad_sync_every: bool = True  # FSDP reduce-scatters each micro-step (else the last)
    # the optimizer steps parameter by parameter (MuonAdamW, not fused AdamW): its
    # temporaries count at the step (formulas.step_temporaries)
    unfused_step: bool = False
    # what the head's backward holds beyond the saved tensors (fp32 without soft-capping:
    # formulas.head_backward_transient; 0: not modelled)
    head_grad: int = 0
    # DDP keeps its gradient buckets beside autograd's gradients (ddp and zero with
    # --no-gradient-as-bucket-view): a second copy through the whole step
    bucket_copy: bool = False

    def copies(self) -> list[int]:
        return list(self.state_copies) or [f.ADAMW_COPIES] * len(self.param_shapes)

    def groups(self) -> list[int]:
        return list(self.optim_groups) or [0 if len(p) >= 2 else 1
                                           for p in self.param_shapes]


def optimizer_layout(layout: f.MiniGPTShapes, V: int, optimizer: str
                     ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(state copies, group) per parameter, as `runtime.optim.make_optimizer` builds
    them: AdamW (2 copies) in groups [matrices, vectors]; Muon (1 copy, its momentum) for
    the blocks' Linear weights (the head, tied or not, is not in a block) — in groups
    [Muon's, other matrices, vectors]."""
    shapes = layout.all
    if optimizer == "adamw":
        return (tuple(f.ADAMW_COPIES for _ in shapes),
                tuple(0 if len(p) >= 2 else 1 for p in shapes))
    if optimizer != "muon":
        raise ValueError(f"unknown optimizer {optimizer!r}: adamw or muon")
    first = len(layout.embeddings)
    in_blocks = range(first, first + layout.n_blocks * len(layout.block))
    hidden = [i in in_blocks and len(p) == 2 for i, p in enumerate(shapes)]
    return (tuple(f.MUON_COPIES if h else f.ADAMW_COPIES for h in hidden),
            tuple(0 if h else 1 if len(p) >= 2 else 2 for h, p in zip(hidden, shapes)))


def minigpt_facts(L: int, H: int, C: int, T: int, V: int, B: int, bias: bool,
                  s: int = f.FP32, params_low: bool = False,
                  reduce_low: bool = False, *, rope: bool = False, tied: bool = True,
                  qk_norm: bool = False, softcap: bool = False,
                  optimizer: str = "adamw") -> ModelFacts:
    """MiniGPT's facts with s-byte activations: fp32 (s=4); s=2 under autocast with fp32
    parameters (ddp, zero: the residual stream stays fp32, weights are copied), or with
    s-byte parameters (`params_low`: FSDP's mixed precision gathers them in bf16/fp16;
    its gradients are reduced in fp32 unless `reduce_low`, --fsdp-bf16-reduce).
    `rope`: rotary positions (no position table; rotation tables held as buffers);
    `qk_norm`: both save more per block (`attention_option_activations`); `softcap`: the
    soft-capped logits are fp32 and tanh's output is saved; `tied`: the head shares wte's
    weight (else a V×C lm_head of its own); `optimizer`: adamw or muon (`optimizer_layout`)."""
    layout = f.minigpt_layout(L, C, V, T, bias, rope=rope, tied=tied)
    shapes, block = layout.all, layout.block
    autocast = s < f.FP32 and not params_low
    if autocast:
        block_saved = f.minigpt_block_activations_autocast(
            B, T, C, H, sum(map(f.numel, block)), s)
        head = f.minigpt_head_activations_autocast(B, T, C, V, s)
    else:
        block_saved = f.minigpt_block_activations(B, T, C, H, s)
        head = f.minigpt_head_activations(B, T, C, V, s)
    block_saved += f.attention_option_activations(B, T, C, H, s, rope=rope, qk_norm=qk_norm)
    if softcap:
        head += f.softcap_activations(B, T, V)
    copies, groups = optimizer_layout(layout, V, optimizer)
    return ModelFacts(
        shapes, block, layout.root, L,
        block_saved=block_saved, block_input=B * T * C * (f.FP32 if autocast else s),
        head_saved=head, logits=B * T * V * (f.FP32 if softcap else s),
        loss_grads=2 * B * T * V * f.FP32,
        block_grads_in_flight=f.mlp_backward_in_flight(B, T, C, s),
        flops_per_token=f.minigpt_flops_per_token(
            f.minigpt_matmul_params(L, C, V, T, bias, rope=rope, tied=tied), L, H, C, T),
        tokens=B * T,
        gathered=s if params_low else f.FP32,
        reduced=s if params_low and reduce_low else f.FP32,
        cast_cache=sum(map(f.numel, block)) * s if autocast else 0,
        block_forward_peak=f.mlp_forward_transient(B, T, C, s,
                                                   f.FP32 if autocast else s),
        state_copies=copies, optim_groups=groups, unfused_step=optimizer == "muon",
        head_grad=f.head_backward_transient(B, T, C, V) if s == f.FP32 and not softcap else 0,
        buffers=f.rope_buffers(L, T, C, H) if rope else 0)


@dataclass(frozen=True)
class Variant:
    label: str  # ddp, zero, fsdp, fsdp (no reshard), hsdp (R × S), tp T × dp_shard S
    strategy: str
    reshard: bool = True
    replicate: int = 1  # HSDP's dp_replicate: fsdp shards over W / replicate ranks
    tp: int = 1  # tensor-parallel ranks: each holds its split of the blocks' matrices
    pp: int = 1  # pipeline stages (plan.pipeline): each rank holds one stage's part
    schedule: str = "1f1b"  # the pipeline's schedule (gpipe, 1f1b)
    keeps_outputs: bool = False  # the last stage keeps its outputs to the step's end (a
    # torch without `step(return_outputs=False)`: strategies.pipeline.drops_outputs)

    def shard_ranks(self, W: int) -> int:
        """The ranks one parameter is split across by FSDP (a replica group's under HSDP,
        a tensor-parallel split's copies under TP, a stage's ranks under PP)."""
        return W // (self.replicate * self.tp * self.pp)

    @property
    def layout(self) -> dict[str, int] | None:
        """The mesh the measurement runs it on (`--pp P --dp-replicate R --dp-shard -1
        --tp T`); None: the strategy over the whole world."""
        if self.replicate == 1 and self.tp == 1 and self.pp == 1:
            return None
        dims = {"pp": self.pp, "dp_replicate": self.replicate, "dp_shard": -1, "tp": self.tp}
        return {k: v for k, v in dims.items() if v != 1}

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


def pipeline_variant(pp: int, schedule: str, replicate: int, shard: int,
                     reshard: bool = True, keeps_outputs: bool = False) -> Variant:
    """Pipeline stages over FSDP2 inside each (plan.pipeline), e.g. "pp 2 (1f1b) ×
    dp_shard 2"."""
    inner = mesh_variant(replicate, shard, reshard=reshard)
    return replace(inner, label=f"pp {pp} ({schedule}) × {inner.label}", pp=pp,
                   schedule=schedule, keeps_outputs=keeps_outputs)


def mesh_variant(replicate: int, shard: int, tp: int = 1, reshard: bool = True) -> Variant:
    """FSDP2 on a (dp_replicate, dp_shard, tp) mesh: each replica group shards the model
    over `shard` ranks (memory: fsdp's at that width, of each rank's tensor-parallel split
    under `tp`); the groups all-reduce the gradient shards. `reshard`:
    --fsdp-reshard-after-forward (the label says when it is off)."""
    off = "" if reshard else ", no reshard"
    label = f"hsdp ({replicate} × {shard}{off})" if replicate > 1 else \
        f"dp_shard {shard}{off}"
    return Variant(f"tp {tp} × {label}" if tp > 1 else label, "fsdp", reshard=reshard,
                   replicate=replicate, tp=tp)


def moments(facts: ModelFacts, variant: Variant, W: int, checkpointed: bool,
            s: int = f.FP32) -> dict[str, dict[str, int]]:
    """{moment: {component: bytes}} for the step's candidate peaks (see the module doc):
    backward start, the head's backward, each block's backward (k blocks already done),
    the last block's forward, the root's reduce-scatter, the optimizer step.

    FSDP's parameters in use (the root, and blocks gathered and entered) count as
    parameters; buffers of collectives in flight (`_fsdp_in_flight`) as communication."""
    P = f.param_bytes(facts.param_shapes, s=s)
    L = facts.n_blocks
    sharded = variant.sharded
    W = variant.shard_ranks(W)  # (HSDP: a replica group holds what fsdp over W would)
    shard = f.param_bytes(facts.param_shapes, W, sharded=True, s=s)
    block = f.gathered_bytes(facts.block_shapes, W, s=facts.gathered)  # (padded)
    block_shard = f.param_bytes(facts.block_shapes, W, sharded=True, s=s)
    if sharded:
        base = {"parameters": shard + f.gathered_bytes(facts.root_shapes, W, s=facts.gathered)
                + facts.buffers, "gradients": 0,
                "optimizer": optimizer_bytes(facts, variant, W, s), "communication": 0}
    else:
        base = {"parameters": P + facts.buffers, "gradients": P,
                "optimizer": optimizer_bytes(facts, variant, W, s), "communication": 0}
    held = _held_gradients(facts, variant, W, s)  # from the earlier micro-steps
    base["gradients"] += held
    per_block = facts.block_input if checkpointed else facts.block_saved
    saved = L * per_block + facts.head_saved
    kept = L if sharded and not variant.reshard else 0  # blocks gathered since forward
    out = {"backward start": {
        **base, "parameters": base["parameters"] + kept * block,
        "communication": block if sharded and variant.reshard else 0,
        "activations": saved + facts.logits + facts.loss_grads}}
    if facts.head_grad and not sharded:  # (FSDP: the root's backward is not listed)
        out["head backward"] = {**base, "activations": saved + facts.logits + facts.head_grad}
    copy = _copies_beside_buckets(facts, variant)
    beside = f.param_bytes(facts.block_shapes, s=s) if copy else 0  # (one block's)
    for k in range(L if facts.block_saved else 0):  # block L-1-k's backward, k blocks
        # done, the head's tensors freed (known for MiniGPT; a traced model: not)
        if checkpointed:  # earlier blocks' inputs, this block recomputed
            alive = (L - 1 - k) * facts.block_input + facts.block_saved
        else:  # this block's and the earlier blocks' saved tensors
            alive = (L - k) * facts.block_saved
        in_use = (L - k) if kept else 1
        out[f"block {L - 1 - k} backward"] = {
            **base, "parameters": base["parameters"] + (in_use * block if sharded else 0),
            "gradients": base["gradients"] + (k * block_shard if sharded and not held
                                              else 0),  # (shards held: added in place)
            "communication": _fsdp_in_flight(facts, variant, k, W) if sharded else k * beside,
            "activations": alive + facts.logits + facts.block_grads_in_flight}
    out.update(_late_moments(facts, variant, W, base, checkpointed, s))
    if copy:  # every autograd gradient beside the buckets at the step
        out["optimizer step"]["communication"] += P
    return out


def _late_moments(facts: ModelFacts, variant: Variant, W: int, base: dict[str, int],
                  checkpointed: bool, s: int) -> dict[str, dict[str, int]]:
    """The moments after the blocks' backward (and the checkpointed forward's last block):
    the last block's forward, the root's reduce-scatter (FSDP), the optimizer step. `W`:
    the ranks one parameter is sharded over."""
    sharded = variant.sharded
    shard = f.param_bytes(facts.param_shapes, W, sharded=True, s=s)
    out: dict[str, dict[str, int]] = {}
    if checkpointed:  # the last block's forward: every block's input kept, and under
        # autocast its weight copies too (the cast cache lives until forward ends)
        block = f.gathered_bytes(facts.block_shapes, W, s=facts.gathered)
        out["forward, last block"] = {
            **base, "parameters": base["parameters"] + (block if sharded else 0),
            "activations": facts.n_blocks * (facts.block_input + facts.cast_cache)
            + facts.block_forward_peak}
    if sharded and facts.root_shapes and (facts.grad_accum == 1 or facts.grad_sync_every):
        out["root's reduce-scatter"] = _root_reduce_scatter(facts, base, shard, W)
    out["optimizer step"] = {**base, "gradients": shard if sharded else
                             f.param_bytes(facts.param_shapes, s=s),
                             "optimizer": step_optimizer_bytes(facts, variant, W, s),
                             "activations": facts.logits}
    return out


def _copies_beside_buckets(facts: ModelFacts, variant: Variant) -> bool:
    """DDP without gradient-as-bucket-view: `gradients` are its buckets, through the whole
    step; autograd's own gradients come beside them as backward makes them (none at its
    start, the k blocks done at a block's backward — the head's own not counted there —
    all of them at the optimizer step), counted as communication (the tracker's
    temporaries). Not with --grad-accum > 1: there they are the held gradients
    (`_held_gradients`)."""
    return facts.bucket_copy and not variant.sharded and facts.grad_accum == 1


def _root_reduce_scatter(facts: ModelFacts, base: dict[str, int], shard: int,
                         W: int) -> dict[str, int]:
    """FSDP at the end of backward, the root's gradients reduce-scattered last: every
    parameter back to its shard (the root resharded), every other gradient a shard, and in
    flight the root's unsharded gradients (gathered dtype), the reduce-scatter's input and
    its 1/W output (reduce dtype), padded as the collective takes them — 2.5× the root's
    gradients at W = 2, measured with torch's tracker (V = 4096 and 8192, 2 gloo ranks)."""
    unsharded = f.gathered_bytes(facts.root_shapes, W, s=facts.gathered)
    reduced = f.gathered_bytes(facts.root_shapes, W, s=facts.reduced)
    return {**base, "parameters": base["parameters"] - f.gathered_bytes(
                facts.root_shapes, W, s=facts.gathered),
            "gradients": shard, "activations": facts.logits,
            "communication": unsharded + reduced + reduced // W}


def _held_gradients(facts: ModelFacts, variant: Variant, W: int, s: int = f.FP32) -> int:
    """Gradients kept from the earlier micro-steps of an accumulation window, alive through
    the last one's backward: ddp/zero's own (autograd's, beside DDP's buckets; the last
    micro-step's sync makes them bucket views), FSDP's shards (`--fsdp-grad-sync every`:
    later micro-steps add into them), or its unsharded gradients (`last`)."""
    if facts.grad_accum == 1:
        return 0
    if not variant.sharded:
        return f.param_bytes(facts.param_shapes, s=s)
    if facts.grad_sync_every:
        return f.param_bytes(facts.param_shapes, W, sharded=True, s=s)
    return f.param_bytes(facts.param_shapes, s=facts.gathered)


def optimizer_bytes(facts: ModelFacts, variant: Variant, W: int, s: int = f.FP32) -> int:
    """The optimizer state one rank holds (the fullest): of every parameter (ddp), of its
    ZeRO partition (zero), or of its shard of every parameter (fsdp) — each parameter's
    state copies (AdamW 2, Muon 1) times its bytes."""
    copies = facts.copies()
    if variant.sharded:
        return f.optimizer_state_bytes(facts.param_shapes, copies, W, sharded=True, s=s)
    if "optimizer" in variant.shards:
        return f.zero_state_bytes(facts.param_shapes, copies, W, facts.groups(), s=s)
    return f.optimizer_state_bytes(facts.param_shapes, copies, s=s)


def step_optimizer_bytes(facts: ModelFacts, variant: Variant, W: int,
                         s: int = f.FP32) -> int:
    """What the optimizer holds at its step's own peak: its state, and for a
    per-parameter step (`unfused_step`) the temporaries of formulas.step_temporaries —
    under ZeRO on the rank where state and temporaries together are largest, its
    parameters in the order ZeroRedundancyOptimizer gives them (each group largest
    first). `W`: the ranks one parameter is sharded over (fsdp)."""
    state = optimizer_bytes(facts, variant, W, s)
    if not facts.unfused_step:
        return state
    shapes, copies, groups = facts.param_shapes, facts.copies(), facts.groups()
    muon = [c == f.MUON_COPIES for c in copies]
    if variant.sharded or "optimizer" not in variant.shards:  # fsdp; ddp
        order = [[i for i in range(len(shapes)) if groups[i] == g] for g in sorted(set(groups))]
        return state + f.step_temporaries(shapes, muon, order, W if variant.sharded else 1, s)
    rank_of = f.zero_assignment(shapes, W, groups)
    most = 0
    for k, held in enumerate(f.zero_rank_states(shapes, copies, W, groups, s)):
        mine = [i for i in range(len(shapes)) if rank_of[i] == k]
        order = [sorted((i for i in mine if groups[i] == g), key=lambda i: -f.numel(shapes[i]))
                 for g in sorted(set(groups))]
        most = max(most, held + f.step_temporaries(shapes, muon, order, s=s))
    return most


def _fsdp_in_flight(facts: ModelFacts, variant: Variant, k: int, W: int = 1) -> int:
    """FSDP buffers in flight during block L-1-k's backward: the next block's parameters
    gathered ahead (backward prefetch; none after the first block, none when blocks stay
    gathered since forward) and the previous block's full gradients, in the reduce
    dtype, waiting for their reduce-scatter (from the second block on) — both padded to
    W · ⌈d0/W⌉ rows, as the collectives take them (`formulas.gathered_bytes`)."""
    L = facts.n_blocks
    gathered = f.gathered_bytes(facts.block_shapes, W, s=facts.gathered)
    prefetch = gathered if variant.reshard and k < L - 1 else 0
    return prefetch + (f.gathered_bytes(facts.block_shapes, W, s=facts.reduced)
                       if k >= 1 else 0)


def peak(facts: ModelFacts, variant: Variant, W: int, checkpointed: bool,
         s: int = f.FP32) -> dict:
    """{component: bytes at the peak moment, "peak": their sum, "moment": which one}."""
    found = moments(facts, variant, W, checkpointed, s)
    name, parts = max(found.items(), key=lambda kv: sum(kv[1].values()))
    return {**{c: parts[c] for c in COMPONENTS}, "peak": sum(parts.values()), "moment": name}
