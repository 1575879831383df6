"""Phalanx's training step vs a plain hand-written DDP loop (seed 002's style), side by side.

Same MiniGPT, same data, same per-rank batch, same ranks and threads, same process group.
Blocks of steps alternate between the two (A B A B ...), after a warm-up of each; the
per-step time of a block is the slowest rank's (all-reduce MAX). Prints medians, min–max
and the ratio Phalanx / plain paired by round with a bootstrap 95% interval (lower is
better; goal <= 1.00). `phalanx bench --peers` does the same with Accelerate and Fabric.

    python benchmarks/step_vs_plain_ddp.py [--nproc 2] [--repeats 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import phalanx
    from phalanx.bench import peers
    from phalanx.bench.runner import compare
    from phalanx.config.sections import build_config
    from phalanx.data.corpus import prepare_data

    cfg = build_config({})
    tokens = prepare_data(cfg.data)  # the default's splits: bench's `tokens` argument
    d = cfg.dist
    run = phalanx.init(cfg.train.seed, bucket_cap_mb=args.bucket_cap_mb or d.bucket_cap_mb,
                       gradient_as_bucket_view=d.gradient_as_bucket_view,
                       static_graph=args.static_graph or d.static_graph)
    with run:  # the same setups and timing as `phalanx bench --peers` (phalanx.bench)
        steps = {"plain": peers.plain(cfg, tokens, run), "phalanx": peers.phalanx(cfg, tokens, run)}
        times = compare(run, steps, args.repeats, args.steps, args.warmup)
        if run.is_main:
            Path(args.result).write_text(json.dumps(times))


def report(times: dict, args) -> None:
    from phalanx.bench.stats import ratio_interval

    for name, values in times.items():
        print(f"{name:8s} median {statistics.median(values) * 1e3:7.1f} ms/step   min–max "
              f"{min(values) * 1e3:.1f}–{max(values) * 1e3:.1f} ms   ({len(values)} blocks of "
              f"{args.steps} steps)")
    mid, low, high = ratio_interval(times["phalanx"], times["plain"])
    print(f"ratio phalanx / plain, paired by round = {mid:.3f} (95% CI {low:.3f}–{high:.3f}; "
          f"goal <= 1.00)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--result", default="")
    parser.add_argument("--bucket-cap-mb", type=float, default=None,
                        help="Phalanx side only (default: Phalanx's default)")
    parser.add_argument("--static-graph", action="store_true", help="Phalanx side only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    from phalanx.launch.agent import launch_workers, threads_per_rank

    result = Path(args.result or "/tmp/phalanx-bench-step.json")
    argv = [__file__, "--worker", "--result", str(result), "--repeats", str(args.repeats),
            "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.bucket_cap_mb:
        argv += ["--bucket-cap-mb", str(args.bucket_cap_mb)]
    if args.static_graph:
        argv += ["--static-graph"]
    launch_workers(argv, args.nproc, threads=threads_per_rank(args.nproc, None))
    report(json.loads(result.read_text()), args)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
