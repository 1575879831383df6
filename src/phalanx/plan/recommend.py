"""`phalanx plan`'s table: per-rank memory at the peak of each strategy variant (ddp, zero,
fsdp with and without reshard-after-forward), whether it fits, the largest micro-batch
that does, the predicted step time, and one recommendation. Torch-free: the formulas of
phalanx.plan.estimate and phalanx.plan.timing on the config's shapes."""

from __future__ import annotations

from phalanx.plan import estimate, timing
from phalanx.plan import formulas as f
from phalanx.plan.devices import human


def facts_for(cfg, micro_batch: int | None = None,
              variant: estimate.Variant | None = None) -> estimate.ModelFacts:
    """MiniGPT's facts; with bf16/fp16, FSDP's mixed precision gathers parameters in
    low precision while ddp/zero autocast fp32 parameters (different activations)."""
    m = cfg.model
    s = 4 if cfg.train.precision == "fp32" else 2
    low = s < 4 and variant is not None and variant.sharded  # FSDP: parameters gathered
    return estimate.minigpt_facts(m.n_layer, m.n_head, m.n_embd, m.block_size, 256,
                                  micro_batch or cfg.train.micro_batch_size, m.bias, s,
                                  params_low=low, reduce_low=cfg.dist.fsdp_bf16_reduce)


def plan(cfg, W: int, dev, mfu: float, peak_flops: float | None,
         busbw: float | None, facts: estimate.ModelFacts | None = None) -> dict:
    """Every variant's memory at its peak, whether it fits, its largest micro-batch
    (MiniGPT; None for a user's model) and step time; and a recommendation."""
    checkpointed = cfg.model.activation_checkpointing
    user = facts is not None
    budget = dev.usable if dev.peak_flops else dev.usable // W  # CPU ranks share the RAM
    rows = []
    for v in estimate.VARIANTS:
        facts = facts if user else facts_for(cfg, variant=v)
        assert facts is not None  # the user's (given), or MiniGPT's
        mem = estimate.peak(facts, v, W, checkpointed)
        row = {"strategy": v.label, **mem, "fits": mem["peak"] <= budget,
               "largest_micro_batch": None if user else
               largest_micro_batch(cfg, v, W, budget)}
        if peak_flops and busbw and not user:
            row["time"] = _time(cfg, facts, v, W, mfu, peak_flops, busbw)
        rows.append(row)
    return {"model": "yours" if user else "MiniGPT", "world_size": W, "device": dev.name,
            "device_note": dev.note,
            "budget_bytes": budget, "activation_checkpointing": checkpointed,
            "precision": cfg.train.precision, "micro_batch": cfg.train.micro_batch_size,
            "mfu": mfu, "peak_flops": peak_flops, "busbw": busbw, "rows": rows,
            "recommendation": recommend(rows, budget)}


def _time(cfg, facts, v, W: int, mfu: float, peak_flops: float, busbw: float) -> dict:
    P = f.param_bytes(facts.param_shapes)
    passes = timing.comm_per_pass(v.strategy, v.reshard, P, P, W, cfg.train.grad_accum)
    t = timing.step_time(facts.flops_per_token, facts.tokens * cfg.train.grad_accum,
                         peak_flops, mfu, passes, busbw)
    return {"compute_s": t.compute_s, "comm_bytes": t.comm_bytes, "comm_s": t.comm_s,
            "exposed_s": t.exposed_s, "step_s": t.step_s}


def largest_micro_batch(cfg, v, W: int, budget: int, limit: int = 1 << 16) -> int:
    """The largest micro-batch whose peak fits `budget` (0: not even 1)."""
    fits = lambda b: estimate.peak(facts_for(cfg, b, v), v, W,  # noqa: E731
                                   cfg.model.activation_checkpointing)["peak"] <= budget
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= limit and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


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
        best = min(fitting, key=lambda r: (round(r["time"]["step_s"], 4),
                                           r["time"]["comm_bytes"], r["peak"]))
        why = f"the fastest predicted step ({best['time']['step_s'] * 1e3:.1f} ms)"
    else:
        replicated = {v.label for v in estimate.VARIANTS if not v.shards}  # (rows: labels)
        best = next((r for r in fitting if r["strategy"] in replicated), fitting[0])
        why = "the least communication"
    return (f"{best['strategy']}: it fits ({human(best['peak'])} of {human(budget)} per "
            f"rank) with {why}.")


def _up_to(row: dict) -> str:
    n = row["largest_micro_batch"]
    return "" if n is None else f" (it fits up to {n})"
