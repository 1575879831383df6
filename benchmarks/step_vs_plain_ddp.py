"""Phalanx's training step vs a plain hand-written DDP loop (seed 002's style), side by side.

Same MiniGPT, same data, same per-rank batch, same ranks and threads, same process group.
Blocks of steps alternate between the two (A B A B ...), after a warm-up of each; the
per-step time of a block is the slowest rank's (all-reduce MAX). Prints medians, min–max
and the ratio Phalanx / plain (lower is better; goal <= 1.00).

    python benchmarks/step_vs_plain_ddp.py [--nproc 2] [--repeats 7] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plain_setup(cfg, tokens, rank, world):
    """What seed 002 writes by hand: .to(device), DDP(model), AdamW, DistributedSampler."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from phalanx.data import TokenWindows
    from phalanx.train.loop import build_model

    model = DDP(build_model(cfg).to("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    ds = TokenWindows(tokens, cfg.model.block_size)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, drop_last=True)
    loader = DataLoader(ds, batch_size=cfg.train.micro_batch_size, sampler=sampler)
    batches = iter(loader)

    def step():
        for k in range(cfg.train.grad_accum):
            x, y = next(batches)
            _, loss = model(x, y)
            (loss / cfg.train.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def phalanx_setup(cfg, tokens, run, expose: bool = False):
    """The built-in trainer's own step: run.setup/loader/accumulate + loop functions.
    With `expose`, returns (step, model, optimizer)."""
    from phalanx.data import TokenWindows
    from phalanx.train.loop import build_model, micro_steps, optimizer_step
    from phalanx.train.optim import adamw
    from phalanx.train.precision import Precision

    t = cfg.train
    model, opt = run.setup(build_model(cfg), lambda p: adamw(
        p, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2), device=run.device))
    batches = iter(run.loader(TokenWindows(tokens, cfg.model.block_size), t.micro_batch_size,
                              stream=True))
    acc, precision = run.accumulate(model, t.grad_accum), Precision(t.precision, run.device)

    def step():
        micro_steps(model, acc, batches, precision)
        run.checkpoint_staged()  # as the trainer: no-op unless a background save copies
        optimizer_step(model, opt, precision, t.grad_clip)
    return (step, model, opt) if expose else step


def timed(run, step, n: int) -> float:
    """Seconds per step over `n` steps, as seen by the slowest rank."""
    import torch
    import torch.distributed as dist

    run.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    per_step = torch.tensor((time.perf_counter() - t0) / n, dtype=torch.float64)
    dist.all_reduce(per_step, op=dist.ReduceOp.MAX)
    return per_step.item()


def worker(args) -> None:
    import phalanx
    from phalanx.config import build_config
    from phalanx.data.corpus import prepare

    cfg = build_config({})
    splits = prepare(None, None, cfg.data.val_fraction)
    tokens = splits.load("train")
    d = cfg.dist
    run = phalanx.init(cfg.train.seed, bucket_cap_mb=args.bucket_cap_mb or d.bucket_cap_mb,
                       gradient_as_bucket_view=d.gradient_as_bucket_view,
                       static_graph=args.static_graph or d.static_graph)
    with run:
        steps = {"plain": plain_setup(cfg, tokens, run.rank, run.world_size),
                 "phalanx": phalanx_setup(cfg, tokens, run)}
        for name, step in steps.items():
            timed(run, step, args.warmup)
        times = {name: [] for name in steps}
        for r in range(args.repeats):
            order = list(steps) if r % 2 == 0 else list(reversed(steps))
            for name in order:
                times[name].append(timed(run, steps[name], args.steps))
        if run.is_main:
            Path(args.result).write_text(json.dumps(times))


def report(times: dict, args) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, values in times.items():
        print(f"{name:8s} median {med[name] * 1e3:7.1f} ms/step   min–max "
              f"{min(values) * 1e3:.1f}–{max(values) * 1e3:.1f} ms   ({len(values)} blocks of "
              f"{args.steps} steps)")
    print(f"ratio phalanx / plain = {med['phalanx'] / med['plain']:.3f}  (goal <= 1.00)")


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
    from phalanx.launch import launch_workers, threads_per_rank

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
