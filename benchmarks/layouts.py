"""The data-parallel layouts side by side on N gloo ranks (default 4): ddp (dp_replicate N),
fsdp (dp_shard N) and HSDP (dp_replicate 2 × dp_shard N/2) — per-rank memory of the model
states, measured with torch's trackers (`MemTracker`; `FSDPMemTracker` for FSDP2), and the
step time (median over the timed steps, with its interquartile range), in one run.

Each layout is its own launch: `phalanx.init(strategy=..., dp_replicate=...)`, `run.setup`
of MiniGPT + AdamW (fp32), warm-up steps, one tracked step, then the timed steps (each
ends with a barrier, so the slowest rank sets it).

    python benchmarks/layouts.py [--preset small] [--nproc 4] [--steps 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sharded_memory import launched  # (benchmarks/ is on the path: run as a script)

MiB = 2 ** 20


def layouts(n: int) -> dict[str, dict]:
    """label → phalanx.init keywords."""
    return {"ddp": {"strategy": "ddp"}, "fsdp": {"strategy": "fsdp"},
            f"hsdp 2×{n // 2}": {"strategy": "fsdp", "dp_replicate": 2}}


def worker(label: str, preset: str, steps: int, out: str) -> None:
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    import phalanx
    from phalanx.config.sections import build_config
    from phalanx.models import build_model
    from phalanx.runtime.optim import adamw

    n = int(os.environ["WORLD_SIZE"])
    with phalanx.init(0, **layouts(n)[label]) as run:
        cfg = build_config({"model": {"preset": preset}})
        model, opt = run.setup(build_model(cfg), lambda p: adamw(
            p, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device=run.device))
        x = torch.randint(0, 256, (2, 64))

        def step():
            _, loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)

        for _ in range(2):
            step()
        tracker = FSDPMemTracker(model, opt) if run.strategy.sharded else MemTracker()
        if not run.strategy.sharded:
            tracker.track_external(model, opt)
        with tracker:
            step()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
        found = {str(k).split(".")[-1]: v for k, v in peak.items()}
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            run.barrier()
            times.append(time.perf_counter() - start)
        everyone = run.gather_objects(found)
        if run.is_main:
            Path(out).write_text(json.dumps({"label": run.strategy.label, "ranks": everyone,
                                             "times": times}))


def state(found: dict) -> float:
    """Parameters + gradients + optimizer state (sharded parts only), bytes."""
    return sum(v for k, v in found.items()
               if k in ("PARAM", "SHARDED_PARAM", "GRAD", "SHARDED_GRAD", "OPT"))


def summarise(results: dict, n: int, preset: str) -> list[str]:
    base = max(state(f) for f in results["ddp"]["ranks"])
    lines = [f"MiniGPT `{preset}`, fp32 AdamW, micro-batch 2 × 64 tokens, {n} gloo ranks; "
             f"model states per rank (the largest rank) and step time.", "",
             "| layout | strategy as run | params+grads+opt MiB | / ddp | peak MiB | "
             "step ms (median) | IQR ms |", "|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        worst = max(r["ranks"], key=state)
        q = statistics.quantiles(r["times"], n=4)
        lines.append(f"| {label} | {r['label']} | {state(worst) / MiB:.2f} | "
                     f"{state(worst) / base:.3f} | {worst.get('Total', 0) / MiB:.2f} | "
                     f"{statistics.median(r['times']) * 1e3:.0f} | "
                     f"{q[0] * 1e3:.0f}–{q[2] * 1e3:.0f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    args = parser.parse_args()
    if args.nproc < 4 or args.nproc % 2:
        parser.error("--nproc must be even and at least 4 (HSDP: 2 replicas of >= 2 shards)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in layouts(args.nproc):
            out = Path(tmp) / "result.json"
            results[label] = launched(__file__, [label, args.preset, str(args.steps),
                                                 str(out)], out, args.nproc)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\n".join(summarise(results, args.nproc, args.preset)))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
