"""The planner's pipeline stages (`--pp P`, FSDP2 inside each stage): what each stage's
rank holds at its step's peak, under torch's GPipe and 1F1B schedules, as
`strategies.pipeline` runs MiniGPT (cut by blocks, `config.layout.stage_blocks`; the
embedding on the first stage, the final norm and an untied head on the last).

A step runs M micro-batches (`--grad-accum`). What a stage saves for one micro-batch's
backward: its blocks' saved tensors, and its output (the first stages), or the head's
saved tensors and the logits (the last). How many are saved at once is the schedule's:
GPipe runs every forward first (M in flight); 1F1B runs min(M, P − s) forwards on stage s
before its first backward and then one forward per backward (a stage's in-flight count
never grows past that; the last stage holds one).

Besides, measured with torch's memory tracker on 4 gloo ranks (`phalanx plan --pp 2
--dp-shard 2 --measure`; docs/plan.md):
- FSDP inside a stage: every backward but the last skips the gradient sync (torch's stage
  sets it so): from the second micro-batch's backward on, the stage's gradients are whole
  (unsharded, fp32), and each backward makes the stage's fresh gradients beside them
  before they are added; the root's parameters and the block computed are gathered. Before the first backward, a forward holds
  the root's and the block's gathered parameters, and the all-gathers' outputs again
  (counted with the activations).
- The last stage holds a micro-batch's logits until its backward and makes the loss's
  gradients (2 · B·T·V fp32) at each backward's start; its root is not gathered then.
  (With a torch whose schedules cannot be told to drop them — `keeps_outputs` — it keeps
  every micro-batch's logits to the step's end and then merges them: a second copy.)
- torch's stage also leaves the parameters gathered after every backward but the last;
  the plan counts the root and one block gathered at the second backward's start (what
  was measured at the peak); where parameters outweigh activations a later block's
  backward, with every block of the stage gathered, may be higher (not measured yet).
- Each stage keeps a receive buffer per micro-batch for the activations it gets (all but
  the first) and for the gradients it gets (all but the last): B·T·C fp32 each, counted
  as communication.
"""

from __future__ import annotations

from dataclasses import replace

from phalanx.config.layout import stage_blocks
from phalanx.models.shapes import MiniGPTShapes
from phalanx.plan import formulas as f
from phalanx.plan.estimate import (
    COMPONENTS,
    ModelFacts,
    Variant,
    optimizer_layout,
    step_optimizer_bytes,
)


def unplanned(cfg) -> str | None:
    """What the planner does not model under pipeline stages yet (None: it models the
    config), said as the option found."""
    m = cfg.model
    tp = cfg.dist.tp
    found = [(m.factory is not None, "`--model` (your model's stages are not traced yet)"),
             (isinstance(tp, int) and tp > 1, f"`--tp {tp}` inside the stages"),
             (m.activation_checkpointing, "`--activation-checkpointing`"),
             (not cfg.dist.fsdp_reshard_after_forward, "`--no-fsdp-reshard-after-forward`")]
    return next((what for hit, what in found if hit), None)


def in_flight(schedule: str, stages: int, stage: int, microbatches: int) -> int:
    """Micro-batches stage `stage` has run forward before its first backward: all of them
    under GPipe; min(M, P − s) under 1F1B (torch's warm-up)."""
    if schedule == "gpipe":
        return microbatches
    return min(microbatches, stages - stage)


def bubble(stages: int, microbatches: int) -> float:
    """The share of a step a stage idles, GPipe and 1F1B alike: (P − 1) / (M + P − 1)."""
    return (stages - 1) / (microbatches + stages - 1)


def stage_facts(facts: ModelFacts, cfg, vocab: int, stages: int, stage: int) -> ModelFacts:
    """`facts` (the whole MiniGPT's, per micro-batch) for the parameters stage `stage`
    holds; the head's tensors on the last stage only."""
    m = cfg.model
    whole = f.minigpt_layout(m.n_layer, m.n_embd, vocab, m.block_size, m.bias, rope=m.rope,
                             tied=False)
    n = len(stage_blocks(m.n_layer, stages, stage))
    last = stage == stages - 1
    mine = MiniGPTShapes(whole.embeddings if stage == 0 else [], whole.block, n,
                         whole.tail if last else [])
    copies, groups = optimizer_layout(mine, vocab, cfg.train.optimizer)
    head = int(last)  # (the head's tensors: the last stage's only)
    return replace(facts, param_shapes=mine.all, root_shapes=mine.root, n_blocks=n,
                   state_copies=copies, optim_groups=groups,
                   head_saved=head * facts.head_saved, logits=head * facts.logits,
                   loss_grads=head * facts.loss_grads, head_grad=0,
                   buffers=facts.buffers * n // m.n_layer)


def stage_flops_per_token(cfg, mine: ModelFacts, vocab: int, last: bool) -> int:
    """Training FLOPs per token of one stage (`mine`: its `stage_facts`;
    `formulas.minigpt_flops_per_token` on its part): 6 × its blocks' matrices, and the
    head's on the last stage (the embedding is a lookup), + attention over its blocks."""
    m = cfg.model
    matmul = mine.n_blocks * sum(f.numel(p) for p in mine.block_shapes if len(p) == 2)
    if last:
        matmul += vocab * m.n_embd
    return f.minigpt_flops_per_token(matmul, mine.n_blocks, m.n_head, m.n_embd, m.block_size)


def heaviest_stage(facts: ModelFacts, cfg, vocab: int, stages: int) -> ModelFacts:
    """The facts of the stage with the most FLOPs per token (the pipeline runs at its
    pace), its FLOPs per token set."""
    each = [stage_facts(facts, cfg, vocab, stages, s) for s in range(stages)]
    flops = [stage_flops_per_token(cfg, mine, vocab, s == stages - 1)
             for s, mine in enumerate(each)]
    slowest = max(range(stages), key=flops.__getitem__)
    return replace(each[slowest], flops_per_token=flops[slowest])


def boundary_bytes(cfg, facts: ModelFacts) -> int:
    """One micro-batch's activations between two stages: B·T·C fp32 (their gradients
    back are as many)."""
    return facts.tokens * cfg.model.n_embd * f.FP32


def p2p_bytes(cfg, facts: ModelFacts, stages: int) -> int:
    """Bytes a rank sends to its neighbouring stages per optimizer step: each micro-batch's
    activations forward and their gradients back (one direction at the two ends: with 2
    stages every rank sends one)."""
    return cfg.train.grad_accum * boundary_bytes(cfg, facts) * min(2, stages - 1)


def stage_moments(facts: ModelFacts, v: Variant, W: int, stage: int, M: int, io: int,
                  ) -> dict[str, dict[str, int]]:
    """{moment: {component: bytes}} of stage `stage` (`facts`: `stage_facts`'), FSDP over
    `v.shard_ranks(W)` ranks; `io`: one micro-batch's activations between stages."""
    S, P = v.shard_ranks(W), v.pp
    shard = f.param_bytes(facts.param_shapes, S, sharded=True)
    root = f.gathered_bytes(facts.root_shapes, S, s=facts.gathered)
    block = f.gathered_bytes(facts.block_shapes, S, s=facts.gathered)
    last, k = stage == P - 1, in_flight(v.schedule, P, stage, M)
    base = {"parameters": shard + facts.buffers, "gradients": 0,
            "optimizer": step_optimizer_bytes(replace(facts, unfused_step=False), v, S),
            "activations": 0, "communication": M * io * ((stage > 0) + (not last))}
    gathered = {**base, "parameters": shard + facts.buffers + root + block}  # (the block
    # being computed, and the root)
    per_mb = facts.n_blocks * facts.block_saved + (
        facts.head_saved + facts.logits if last else io)
    out = {f"forward of micro-batch {k}": {**gathered,
                                            "activations": k * per_mb + root + 2 * block}}
    if not last:
        out.update(_earlier(facts, gathered, M, k, per_mb))
    else:
        out.update(_last(facts, base, gathered, M, k, per_mb, v.keeps_outputs))
        if v.keeps_outputs:  # merged at the end: a second copy of every micro-batch's
            out["outputs merged"] = {**base, "gradients": shard,
                                     "activations": 2 * M * facts.logits}
    out["optimizer step"] = {**base, "gradients": shard,
                             "optimizer": step_optimizer_bytes(facts, v, S)}
    return out


def _backwards(M: int, k: int) -> list[tuple[int, int, bool]]:
    """(micro-batch, in flight at its backward, gradients held from earlier backwards) of
    the first backward, and of the second (the in-flight count falls by one after the
    first: GPipe's forwards are done, 1F1B's next forward refills what it freed)."""
    return [(1, k, False)] + ([(2, min(M, k + 1) - 1, True)] if M > 1 else [])


def _earlier(facts: ModelFacts, gathered: dict, M: int, k: int, per_mb: int,
             ) -> dict[str, dict[str, int]]:
    """A stage before the last: at each backward, its saved micro-batches and the fresh
    gradients — of the blocks, with the block's own in flight (in a block), or of every
    parameter (at the embedding's backward, after the blocks)."""
    whole = f.param_bytes(facts.param_shapes)
    blocks = facts.n_blocks * f.param_bytes(facts.block_shapes)
    out = {}
    for j, count, held in _backwards(M, k):
        grads = {"gradients": whole if held else 0}
        out[f"backward of micro-batch {j}, in a block"] = {
            **gathered, **grads,
            "activations": count * per_mb + blocks + facts.block_grads_in_flight}
        out[f"backward of micro-batch {j}, its last module"] = {
            **gathered, **grads, "activations": count * per_mb + whole}
    return out


def _last(facts: ModelFacts, base: dict, gathered: dict, M: int, k: int, per_mb: int,
          kept: bool) -> dict[str, dict[str, int]]:
    """The last stage: the loss's gradients made at a backward's start (the root not
    gathered yet), and in a block the fresh gradients of everything after it. A micro-
    batch's logits live until its backward — or, `kept`, every forward's to the step's
    end (1F1B: M of them at the last backward; GPipe: at the first)."""
    saved = per_mb - facts.logits
    whole = f.param_bytes(facts.param_shapes)
    out = {}
    for j, count, held in _backwards(M, k):
        if held and k == 1 and kept:  # 1F1B: its last backward holds every output
            j = M
        logits = (M if kept else count) * facts.logits
        grads = {"gradients": whole if held else 0}
        out[f"backward start, micro-batch {j}"] = {
            **base, **grads, "activations": count * saved + logits + facts.loss_grads}
        out[f"backward of micro-batch {j}, in a block"] = {
            **gathered, **grads, "activations": (count - 1) * saved + logits + whole
            + facts.n_blocks * facts.block_saved + facts.block_grads_in_flight}
    return out


def pipeline_peak(facts: ModelFacts, cfg, vocab: int, v: Variant, W: int) -> dict:
    """{component: bytes at the peak, "peak", "moment", "stage"} of the stage whose rank
    peaks highest."""
    io = boundary_bytes(cfg, facts)
    best: dict = {}
    for stage in range(v.pp):
        mine = stage_facts(facts, cfg, vocab, v.pp, stage)
        found = stage_moments(mine, v, W, stage, cfg.train.grad_accum, io)
        name, parts = max(found.items(), key=lambda kv: sum(kv[1].values()))
        if not best or sum(parts.values()) > best["peak"]:
            best = {**{c: parts[c] for c in COMPONENTS}, "peak": sum(parts.values()),
                    "moment": f"stage {stage}: {name}", "stage": stage}
    return best
