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
from phalanx.plan.devices import GPUS, busbw_from, device
from phalanx.plan.recommend import plan

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


def planned_world(ns: argparse.Namespace, cfg) -> int:
    """`--world-size`; else --nproc-per-node × --nnodes; else one rank per local GPU/core."""
    if ns.world_size is not None:
        return ns.world_size
    if cfg.dist.nproc_per_node:
        return cfg.dist.nproc_per_node * cfg.dist.node_range()[1]
    from phalanx.launch.agent import default_nproc

    return default_nproc()


def run_plan(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.plan.report import print_measured, print_plan

    cfg = resolve(ns)
    if not 0 < ns.mfu <= 1:
        raise UserError(f"`--mfu {ns.mfu}` must be in (0, 1], e.g. 0.4.")
    W = planned_world(ns, cfg)
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
