"""`phalanx bench [train options] [--peers] [--defaults] [--scaling] [--profile]`: measured
side by side in one launch; writes OUT/bench/report.md, results.json, plots and Chrome
traces."""

from __future__ import annotations

import argparse
import json
import os

from phalanx.cluster import protocol
from phalanx.cluster.protocol import under_launcher
from phalanx.config.flags import TRAINING_RUN_ONLY, add_config_flags, count, resolve
from phalanx.config.layout import refuse_pp
from phalanx.errors import UserError

SUMMARY = ("Measure the training step: Phalanx vs a plain DDP loop, Accelerate and Fabric; "
           "where the time goes; scaling.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench's own flags first; then the training options that shape the timed step."""
    group = parser.add_argument_group("bench options")
    group.add_argument("--peers", action="store_true",
                       help="also time a plain DDP loop, Accelerate and Lightning Fabric "
                            "(`pip install phalanx[bench]`)")
    group.add_argument("--scaling", action="store_true",
                       help="weak and strong scaling, 1 … N ranks")
    group.add_argument("--profile", action="store_true",
                       help="torch.profiler step breakdown, exposed communication, traces")
    group.add_argument("--defaults", action="store_true",
                       help="time Phalanx's step with each of its performance defaults put "
                            "back to torch's (static_graph, gradient_as_bucket_view, bucket "
                            "sizes, fused AdamW)")
    group.add_argument("--repeats", type=count(1, 10000), default=5, metavar="N",
                       help="timed blocks each (1-10000; default: 5)")
    group.add_argument("--steps", type=count(1, 10000), default=10, metavar="N",
                       help="steps per block (1-10000; default: 10)")
    group.add_argument("--warmup", type=count(0, 10000), default=3, metavar="N",
                       help="untimed steps first (0-10000; default: 3)")
    add_config_flags(parser, hide=TRAINING_RUN_ONLY + ("model.factory",))


def run_bench(ns: argparse.Namespace, argv: list[str]) -> int:
    """The launching process: `phalanx.bench.parent`; each rank it starts comes back here
    under the launcher: `phalanx.bench.timed_rank` (both import torch: imported here)."""
    if under_launcher():
        from phalanx.bench.timed_rank import worker

        return worker(json.loads(os.environ[protocol.BENCH_PHASE]))
    from phalanx.bench import peers as peer_impls

    cfg = resolve(ns)
    refuse_pp(cfg.dist.pp, "bench")
    if cfg.model.factory:  # (accepted: a `phalanx train` command line still parses)
        raise UserError(f"`phalanx bench` times MiniGPT against other frameworks' loops; "
                        f"`--model {cfg.model.factory}` is not benchmarked. Time your model "
                        f"with `phalanx train --model ...` (its tokens/s) instead.")
    missing = [p for p in ("accelerate", "fabric") if not peer_impls.available(p)]
    if ns.peers and missing:
        raise UserError(f"`--peers` needs {', '.join(peer_impls.PACKAGES[m] for m in missing)}: "
                        f"pip install -c constraints.txt -e \".[bench]\"")
    from phalanx.bench.parent import parent

    return parent(cfg, repeats=ns.repeats, steps=ns.steps, warmup=ns.warmup,
                  peers=ns.peers, profile=ns.profile, defaults=ns.defaults,
                  scaling=ns.scaling)
