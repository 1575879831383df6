"""`phalanx plan [train options] [--world-size N] [--gpu NAME] [--json] [--measure]`:
per-rank memory and step time of ddp, zero and fsdp (with and without reshard-after-
forward) before launching; `--measure` runs a few steps of each on the local ranks and
prints predicted beside measured."""

from __future__ import annotations

import argparse
import json
import sys

from phalanx.config.flags import TRAINING_RUN_ONLY, add_config_flags, count, resolve
from phalanx.errors import UserError
from phalanx.plan import estimate, timing
from phalanx.plan.devices import GPUS, busbw_from, device, human

SUMMARY = ("Predict per-rank memory and step time of each strategy before launching "
           "(--measure: and check it on the local ranks).")
DEFAULT_MFU = 0.4
# nothing is read or written (the data, the run directory) or launched for long
NOT_PLANNED = TRAINING_RUN_ONLY + ("data.path", "data.cache_dir", "data.val_fraction",
                                   "train.out", "dist.max_restarts", "dist.nccl_preset",
                                   "dist.debug_collectives")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """plan's own flags first; then the training options that shape the planned step."""
    g = parser.add_argument_group("plan options")
    g.add_argument("--world-size", type=count(1, 1 << 20), default=None, metavar="N",
                   help="data-parallel ranks to plan for (default: --nproc-per-node × "
                        "--nnodes, or one per local GPU/core)")
    g.add_argument("--gpu", default=None, metavar="NAME",
                   help=f"plan for this GPU: {', '.join(GPUS)} (default: this machine's "
                        f"CPU and RAM)")
    g.add_argument("--mfu", type=float, default=DEFAULT_MFU, metavar="X",
                   help=f"assumed model FLOPs utilisation (default: {DEFAULT_MFU})")
    g.add_argument("--peak-tflops", type=float, default=None, metavar="X",
                   help="the device's dense peak in TFLOP/s (default: the GPU table's)")
    g.add_argument("--busbw-gbs", type=float, default=None, metavar="X",
                   help="all-reduce bus bandwidth in GB/s (default: the GPU table's)")
    g.add_argument("--busbw-from", default=None, metavar="FILE",
                   help="read the bus bandwidth from `phalanx doctor --json` output")
    g.add_argument("--model", default=None, metavar="MODULE:FACTORY",
                   help="plan your model instead of MiniGPT: a function returning (module, "
                        "example input at the micro-batch size), built on the meta device")
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.add_argument("--measure", action="store_true",
                   help="run a few steps of each strategy on the local ranks and print "
                        "predicted beside measured")
    g.add_argument("--measure-steps", type=count(1, 100), default=2, metavar="N",
                   help="steps measured per strategy, after 3 warm-up steps (default: 2)")
    add_config_flags(parser, hide=NOT_PLANNED)


def worldhuman(ns: argparse.Namespace, cfg) -> int:
    if ns.world_size is not None:
        return ns.world_size
    if cfg.dist.nproc_per_node:
        return cfg.dist.nproc_per_node * cfg.dist.node_range()[1]
    from phalanx.launch.agent import default_nproc

    return default_nproc()


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
    from phalanx.plan import formulas as f

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


def run_plan(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.plan.report import print_measured, print_plan

    cfg = resolve(ns)
    if not 0 < ns.mfu <= 1:
        raise UserError(f"`--mfu {ns.mfu}` must be in (0, 1], e.g. 0.4.")
    W = worldhuman(ns, cfg)
    dev = device(ns.gpu)
    peak_flops = ns.peak_tflops * 1e12 if ns.peak_tflops else dev.peak_flops
    busbw = busbw_from(ns.busbw_from) if ns.busbw_from else \
        (ns.busbw_gbs * 1e9 if ns.busbw_gbs else dev.busbw)
    facts = None
    if ns.model:
        from phalanx.plan.user_model import user_facts

        facts = user_facts(ns.model)
        if ns.measure:
            raise UserError("`--measure` runs MiniGPT's training steps; with `--model` it "
                            "has nothing to run. Measure your model with `phalanx doctor "
                            "--model` or your own script.")
    result = plan(cfg, W, dev, ns.mfu, peak_flops, busbw, facts)
    if ns.measure:
        from phalanx.plan.compare import measure_locally

        result["measured"] = measure_locally(cfg, W, ns.measure_steps, result["rows"])
    if ns.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print_plan(result)
        if ns.measure:
            print_measured(result)
    return 0
