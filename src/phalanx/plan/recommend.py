"""`phalanx plan`'s table: per-rank memory at the peak of each strategy variant (ddp, zero,
fsdp with and without reshard-after-forward), whether it fits, the largest micro-batch
that does, the predicted step time, and one recommendation. Torch-free for MiniGPT: the
formulas of phalanx.plan.estimate and phalanx.plan.timing on the config's shapes; a
user's model (`--model`) comes traced (phalanx.plan.user_model)."""

from __future__ import annotations

from dataclasses import replace

from phalanx.config.data_spec import UNKNOWN_VOCAB_FALLBACK, vocab_size_of
from phalanx.plan import estimate, timing
from phalanx.plan import formulas as f
from phalanx.plan.devices import human
from phalanx.plan.layouts import why_not_tp

MICRO_BATCH_LIMIT = 1 << 16  # where the search for the largest micro-batch stops


def planned_vocab(cfg) -> tuple[int, str | None]:
    """The vocabulary the config's `--tokenizer` gives the model, and a note when it is a
    guess: a tokenizer file that cannot be read here is planned at 256 (`bytes`)."""
    found = vocab_size_of(cfg.data.tokenizer, cfg.data.path)
    if found is None:
        why = ("`--data` holds token ids: their vocabulary is known once they are read"
               if cfg.data.tokenizer == "auto" else
               f"the vocabulary of `--tokenizer {cfg.data.tokenizer}` could not be read (not "
               f"a tokenizer.json here)")
        return UNKNOWN_VOCAB_FALLBACK, f"{why}: planned at {UNKNOWN_VOCAB_FALLBACK} tokens"
    return found, None


def facts_for(cfg, micro_batch: int | None = None,
              variant: estimate.Variant | None = None) -> estimate.ModelFacts:
    """MiniGPT's facts, for the config's tokenizer, position embedding, head tying and
    optimizer; with bf16/fp16, FSDP's mixed precision gathers parameters in low precision
    while ddp/zero autocast fp32 parameters (different activations)."""
    m = cfg.model
    s = 4 if cfg.train.precision == "fp32" else 2
    low = s < 4 and variant is not None and variant.sharded  # FSDP: parameters gathered
    facts = estimate.minigpt_facts(m.n_layer, m.n_head, m.n_embd, m.block_size,
                                   planned_vocab(cfg)[0],
                                   micro_batch or cfg.train.micro_batch_size, m.bias, s,
                                   params_low=low, reduce_low=cfg.dist.fsdp_bf16_reduce,
                                   rope=m.rope, tied=m.tie_embeddings,
                                   qk_norm=m.qk_norm, softcap=m.logit_softcap > 0,
                                   optimizer=cfg.train.optimizer)
    if variant is not None and variant.tp > 1:  # one tensor-parallel rank's split
        from phalanx.plan.tensor_parallel import tp_facts

        facts = tp_facts(facts, cfg, variant.tp, micro_batch or cfg.train.micro_batch_size,
                         planned_vocab(cfg)[0])
    return accumulating(cfg, facts)


def accumulating(cfg, facts: estimate.ModelFacts) -> estimate.ModelFacts:
    """`facts` for the config's gradient accumulation (what earlier micro-steps leave) and
    DDP's buckets (a copy beside the gradients with --no-gradient-as-bucket-view)."""
    return replace(facts, grad_accum=cfg.train.grad_accum,
                   grad_sync_every=cfg.dist.fsdp_grad_sync == "every",
                   bucket_copy=not cfg.dist.gradient_as_bucket_view)


def parameter_count(cfg) -> int:
    """MiniGPT's parameters for this config (the tied head counted once)."""
    m = cfg.model
    return sum(map(f.numel, f.minigpt_param_shapes(
        m.n_layer, m.n_embd, planned_vocab(cfg)[0], m.block_size, m.bias, rope=m.rope,
        tied=m.tie_embeddings)))


def plan(cfg, W: int, dev, mfu: float, peak_flops: float | None,
         busbw: float | None, user=None, extra: tuple[estimate.Variant, ...] = (),
         inter: float | None = None) -> dict:
    """Every variant's memory at its peak, whether it fits, its largest micro-batch and
    step time; and a recommendation. `user`: a `plan.user_model.UserModel` (`--model`),
    traced at the planned micro-batch and precision; else MiniGPT's formulas. `extra`:
    variants planned beside the 1-D ones (the HSDP layout asked for)."""
    checkpointed = cfg.model.activation_checkpointing
    B = cfg.train.micro_batch_size
    budget = dev.usable if dev.peak_flops else dev.usable // W  # CPU ranks share the RAM
    rows = []
    for v in estimate.VARIANTS + tuple(extra):
        facts_of = _facts_of(cfg, v, user)
        facts = facts_of(B)
        peak_of = _peak_of(cfg, v, W, checkpointed)
        mem = peak_of(facts)
        scalable = user is None or user.scalable
        row = {"strategy": v.label, "tp": v.tp, "pp": v.pp, **mem,
               "fits": mem["peak"] <= budget,
               "largest_micro_batch": largest_micro_batch(facts_of, peak_of, budget)
               if scalable else None}
        if peak_flops and busbw:
            row["time"] = _time(cfg, facts, v, W, mfu, peak_flops, busbw, inter)
        rows.append(row)
    vocab, vocab_note = planned_vocab(cfg)
    out = {"model": "yours" if user else "MiniGPT", "world_size": W, "device": dev.name,
           "device_note": dev.note, "tokenizer": cfg.data.tokenizer, "vocab_size": vocab,
           "vocab_note": vocab_note, "optimizer": cfg.train.optimizer,
           "parameters": user.n_params if user else parameter_count(cfg),
           "budget_bytes": budget, "activation_checkpointing": checkpointed,
           "precision": cfg.train.precision, "micro_batch": B,
           "mfu": mfu, "peak_flops": peak_flops, "busbw": busbw, "inter_busbw": inter,
           "per_machine": cfg.dist.nproc_per_node or W, "rows": rows,
           "recommendation": recommend(rows, budget)}
    if user:
        out["user_notes"] = [n for n in (user.scale_note(B), user.flops_note(B),
                                         _precision_note(cfg.train.precision)) if n]
    return out


def _peak_of(cfg, v, W: int, checkpointed: bool):
    """facts → the variant's peak (`estimate.peak`; the highest stage's under pipeline
    stages, `plan.pipeline`)."""
    if v.pp > 1:
        from phalanx.plan.pipeline import pipeline_peak

        return lambda facts: pipeline_peak(facts, cfg, planned_vocab(cfg)[0], v, W)
    return lambda facts: estimate.peak(facts, v, W, checkpointed)


def _facts_of(cfg, v, user):
    """micro-batch → the variant's facts: the user's trace (FSDP's: 2-byte gathered
    parameters under bf16/fp16), or MiniGPT's formulas."""
    if user is not None:
        return lambda b: accumulating(cfg, user.facts(b, sharded=v.sharded))
    return lambda b: facts_for(cfg, b, v)


def _precision_note(precision: str) -> str | None:
    if precision == "fp32":
        return None
    return (f"{precision}: ddp/zero traced under torch.autocast over fp32 parameters "
            f"(autocast's CPU op lists on fake tensors; CUDA's differ in a few ops), fsdp "
            f"with parameters and floating inputs in 2 bytes (its mixed-precision policy)")


def comm_passes(cfg, facts, v, W: int) -> dict[str, float]:
    """The bytes one rank sends per optimizer step, by pass (`timing.comm_per_pass`): the
    collectives inside a replica group and, under HSDP, the all-reduce across the groups
    (`comm_groups`), together."""
    return together(*comm_groups(cfg, facts, v, W))


def together(inner: dict[str, float], across: dict[str, float]) -> dict[str, float]:
    """Bytes per pass inside a replica group plus those across the groups."""
    return {k: inner[k] + across.get(k, 0.0) for k in inner}


def comm_groups(cfg, facts, v, W: int) -> tuple[dict[str, float], dict[str, float]]:
    """(bytes per pass over the ranks that shard a parameter — the whole world for a 1-D
    strategy —, bytes per pass across HSDP's replica groups). FSDP moves its parameters
    and gradients in their mixed-precision dtypes (bf16/fp16 gathers, the reduce dtype's
    gradients), dim 0 padded to a multiple of W (`formulas.gathered_bytes`); ddp/zero
    move fp32 (autocast keeps them)."""
    shapes, R, W = facts.param_shapes, v.replicate, v.shard_ranks(W)
    P = f.gathered_bytes(shapes, W, facts.gathered) if v.sharded else f.param_bytes(shapes)
    G = f.gathered_bytes(shapes, W, facts.reduced) if v.sharded else f.param_bytes(shapes)
    hidden = [p for p, c in zip(shapes, facts.copies()) if c == f.MUON_COPIES]
    # FSDP's gradient syncs: each micro-step (`--fsdp-grad-sync every`), or the last only
    syncs = cfg.train.grad_accum if cfg.dist.fsdp_grad_sync == "every" else 1
    inner = timing.comm_per_pass(v.strategy, v.reshard, G, P, W, cfg.train.grad_accum,
                                 muon_bytes=f.gathered_bytes(hidden, W) if v.sharded
                                 else f.param_bytes(hidden), syncs=syncs)
    # HSDP: the replica groups all-reduce each rank's gradient shard at every gradient sync
    across = {"backward": syncs * f.ring_all_reduce_bytes(G // W, R)} if R > 1 else {}
    inner["exposed"] += tp_bytes(cfg, facts, v)  # (counted with the pass it stalls)
    return inner, across


def tp_bytes(cfg, facts, v) -> float:
    """Bytes per step over the TP group (0 without one): its all-reduces and all-gathers
    sit between the matmuls, so nothing hides them."""
    if v.tp <= 1:
        return 0.0
    from phalanx.plan.tensor_parallel import tp_comm_bytes

    return cfg.train.grad_accum * tp_comm_bytes(
        cfg, v.tp, facts.tokens // cfg.model.block_size, planned_vocab(cfg)[0])


def link_seconds(inner: dict[str, float], across: dict[str, float], v, W: int,
                 per_machine: int, busbw: float, inter: float,
                 tp: float = 0.0) -> dict[str, float]:
    """Seconds per pass when machines of `per_machine` ranks talk at `inter` bytes/s and
    ranks inside one at `busbw`: a group's ring runs at its slowest link. A TP group is T
    consecutive ranks (`tp` of `inner["exposed"]`'s bytes are its own); the S ranks that
    shard a parameter are T apart, spanning S·T consecutive ranks (the world for a 1-D
    strategy); a group crosses machines when its span is over `per_machine` or does not
    divide it; HSDP's replica groups (every S·T-th rank) cross as soon as the world does."""
    S, T = v.shard_ranks(W), v.tp

    def link(span: int) -> float:
        return inter if span > per_machine or per_machine % span else busbw

    across_bw = inter if W > per_machine else busbw
    out = {k: inner[k] / link(S * T) + across.get(k, 0.0) / across_bw for k in inner}
    if tp:
        out["exposed"] += tp / link(T) - tp / link(S * T)
    return out


def _time(cfg, facts, v, W: int, mfu: float, peak_flops: float, busbw: float,
          inter: float | None = None) -> dict:
    """The step time at `busbw`; with `inter` (bytes/s between machines of
    --nproc-per-node ranks) each group's collectives at its slowest link. Under pipeline
    stages: `_pipeline_time`."""
    if v.pp > 1:
        return _pipeline_time(cfg, facts, v, W, mfu, peak_flops, busbw, inter)
    inner, across = comm_groups(cfg, facts, v, W)
    passes = together(inner, across)
    per_machine = cfg.dist.nproc_per_node or W
    seconds = link_seconds(inner, across, v, W, per_machine, busbw, inter,
                           tp_bytes(cfg, facts, v)) if inter and W > per_machine else None
    t = timing.step_time(facts.flops_per_token, facts.tokens * cfg.train.grad_accum,
                         peak_flops, mfu, passes, busbw, _muon_flops(facts, v, W), seconds)
    return {"compute_s": t.compute_s, "optimizer_s": t.optimizer_s,
            "comm_bytes": t.comm_bytes, "comm_s": t.comm_s, "exposed_s": t.exposed_s,
            "step_s": t.step_s}


def _pipeline_time(cfg, facts, v, W: int, mfu: float, peak_flops: float, busbw: float,
                   inter: float | None) -> dict:
    """The slowest stage's step on its own ranks (FSDP over the stage's W/P, its FLOPs,
    one gradient reduce-scatter per step), its compute stretched by the bubble — M
    micro-batches take M + P − 1 slots — and the point-to-point sends between stages
    counted as exposed (they sit between the micro-batches' compute; at `inter` between
    machines)."""
    from phalanx.plan.pipeline import bubble, heaviest_stage, p2p_bytes

    P, M = v.pp, cfg.train.grad_accum
    stage = heaviest_stage(facts, cfg, planned_vocab(cfg)[0], P)
    synced = cfg.with_dist(fsdp_grad_sync="last")  # a stage reduce-scatters once a step
    t = _time(synced, stage, replace(v, pp=1), W // P, mfu, peak_flops, busbw, inter)
    idle = t["compute_s"] * bubble(P, M) / (1 - bubble(P, M))
    sent = p2p_bytes(cfg, facts, P)
    # stages are laid out outermost: neighbours are W/P ranks apart, on other machines
    # once a stage fills one (`--layouts` puts them so)
    link = inter if inter and W > (cfg.dist.nproc_per_node or W) else busbw
    return {**t, "compute_s": t["compute_s"] + idle, "bubble_s": idle,
            "comm_bytes": t["comm_bytes"] + sent, "comm_s": t["comm_s"] + sent / link,
            "exposed_s": t["exposed_s"] + sent / link,
            "step_s": t["step_s"] + idle + sent / link}


def _muon_flops(facts, v, W: int) -> int:
    """Newton–Schulz FLOPs of the rank that orthogonalises the most: every hidden matrix
    (ddp; fsdp, on the gathered whole), or the ZeRO share (whole matrices it owns)."""
    copies = facts.copies()
    ns = [f.newton_schulz_flops(p) if c == f.MUON_COPIES else 0
          for p, c in zip(facts.param_shapes, copies)]
    if "optimizer" in v.shards and not v.sharded:
        rank_of = f.zero_assignment(facts.param_shapes, W, facts.groups())
        return max(sum(n for n, r in zip(ns, rank_of) if r == k) for k in range(W))
    return sum(ns)


def largest_micro_batch(facts_of, peak_of, budget: int, limit: int = MICRO_BATCH_LIMIT
                        ) -> int:
    """The largest micro-batch whose peak fits `budget` (0: not even 1), at most `limit`
    (a result of `limit`: that many or more fit); `facts_of`: micro-batch → ModelFacts,
    `peak_of`: ModelFacts → the variant's peak."""
    fits = lambda b: peak_of(facts_of(b))["peak"] <= budget  # noqa: E731
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return min(low, limit)


def recommend(rows: list[dict], budget: int) -> str:
    """One sentence: the fastest that fits (or the least memory when time is unknown)."""
    fitting = [r for r in rows if r["fits"]]
    if not fitting:
        best = min(rows, key=lambda r: r["peak"])
        return (f"nothing fits at this micro-batch: {best['strategy']} needs the least "
                f"({human(best['peak'])} per rank of {human(budget)}); lower "
                f"the micro-batch{_up_to(best)}, turn on activation checkpointing, or add "
                f"ranks.")
    if all("time" in r for r in fitting):
        best, why = _fastest(fitting)
        why += why_not_tp(rows, best)
    else:
        replicated = {v.label for v in estimate.VARIANTS if not v.shards}  # (rows: labels)
        best = next((r for r in fitting if r["strategy"] in replicated), fitting[0])
        why = "the least communication"
    return (f"{best['strategy']}: it fits ({human(best['peak'])} of {human(budget)} per "
            f"rank) with {why}.")


def batch_share(row: dict) -> int:
    """How many of the row's steps make one of the others' global batch: T under tensor
    parallelism (T ranks share each batch), P under pipeline stages (P ranks run each
    data-parallel batch), their product for both; 1 for the rest."""
    return row.get("tp", 1) * row.get("pp", 1)


def _fastest(fitting: list[dict]) -> tuple[dict, str]:
    """The fastest row, and why; steps equal to 0.1 ms are a tie, broken by the bytes
    sent, then the peak — and the reason says so. A tensor-parallel or pipelined row's
    step takes a share of the others' global batch: compared at `batch_share` steps."""
    step = lambda r: round(r["time"]["step_s"] * batch_share(r), 4)  # noqa: E731
    sent = lambda r: r["time"]["comm_bytes"] * batch_share(r)  # noqa: E731 (those steps')
    best = min(fitting, key=lambda r: (step(r), sent(r), r["peak"]))
    why = f"the fastest predicted step ({best['time']['step_s'] * 1e3:.1f} ms"
    if batch_share(best) > 1:
        why += f", {step(best) * 1e3:.1f} ms for the others' global batch"
    tied = [r for r in fitting if r is not best and step(r) == step(best)]
    if not tied:
        return best, why + ")"
    by = "less communication" if all(sent(r) > sent(best) for r in tied) else \
        "less communication, then memory"
    names = ", ".join(r["strategy"] for r in tied)
    return best, f"{why}, tied with {names}: {by} breaks the tie)"


def _up_to(row: dict) -> str:
    n = row["largest_micro_batch"]
    return "" if n is None else f" (it fits up to {n})"
