"""Time to quality of `phalanx train`'s main job: candidate recipes at one wall-clock budget.

Each candidate (batch, context, model width, learning-rate schedule) is first timed for a
few steps, its step count is set so that training fills the budget, and then it trains
end to end through the real CLI (2 gloo ranks by default, the embedded corpus). Printed:
steps, tokens, wall time of the whole command, final validation loss (nats/byte, on the
same validation split, ~64 K tokens per evaluation); written: results.json and
val_vs_time.png in --out.

    python benchmarks/time_to_quality.py [--budget-s 150] [--only A,B] [--out runs/ttq]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

EVAL_TOKENS = 65536  # per evaluation, over all ranks
CANDIDATES = {  # name: (flags, fixed steps or None: fill the budget)
    "default-0.1": (dict(block_size=128, micro_batch_size=16, lr=2e-3, min_lr=2e-4,
                         warmup_steps=20), 400),
    "ctx64-b12": (dict(block_size=64, micro_batch_size=6, lr=1e-3, min_lr=1e-4,
                       warmup_steps=100), None),
    "ctx64-b16": (dict(block_size=64, micro_batch_size=8, lr=2e-3, min_lr=2e-4,
                       warmup_steps=50), None),
    "ctx64-b32": (dict(block_size=64, micro_batch_size=16, lr=2e-3, min_lr=2e-4,
                       warmup_steps=50), None),
    "ctx128-b8": (dict(block_size=128, micro_batch_size=4, lr=2e-3, min_lr=2e-4,
                       warmup_steps=50), None),
    "ctx64-b16-w192": (dict(block_size=64, micro_batch_size=8, lr=2e-3, min_lr=2e-4,
                            warmup_steps=50, n_embd=192, n_head=6), None),
}


def flags(values: dict) -> list[str]:
    out = []
    for key, value in values.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def train(out: Path, recipe: dict, steps: int, nproc: int, extra: list[str]) -> dict:
    """One `phalanx train` run; its wall time, final val loss and metrics."""
    evals = max(1, math.ceil(EVAL_TOKENS / (recipe["micro_batch_size"] * nproc *
                                            recipe["block_size"])))
    cmd = [sys.executable, "-m", "phalanx", "train", *flags(recipe), "--max-steps", str(steps),
           "--eval-batches", str(evals), "--nproc-per-node", str(nproc), "--resume", "never",
           "--out", str(out), *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in records if "val_loss" in r]
    return {"wall_s": wall, "val_loss": val[-1], "records": records,
            "sample": (out / "sample.txt").read_text(errors="replace")
            if (out / "sample.txt").exists() else ""}


def calibrate(out: Path, recipe: dict, nproc: int) -> float:
    """Median seconds per step over 40 steps (after the first 10)."""
    res = train(out, recipe, 40, nproc, ["--eval-every", "1000", "--log-every", "1",
                                         "--sample-tokens", "0", "--checkpoint-every", "0"])
    times = [r["step_time_s"] for r in res["records"] if r.get("step", 0) > 10
             and "step_time_s" in r]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="training seconds to fill (default: 150)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated candidate names")
    parser.add_argument("--out", default="runs/ttq")
    args = parser.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only else list(CANDIDATES)
    results = {}
    for name in names:
        recipe, fixed = CANDIDATES[name]
        step_s = calibrate(root / f"{name}-calibrate", recipe, args.nproc)
        steps = fixed or int(args.budget_s / step_s)
        evals = max(1, steps // 4)
        res = train(root / name, recipe, steps, args.nproc,
                    ["--eval-every", str(evals), "--checkpoint-every", str(steps)])
        tokens = steps * recipe["micro_batch_size"] * args.nproc * recipe["block_size"]
        results[name] = {"recipe": recipe, "steps": steps, "step_s": step_s, "tokens": tokens,
                         **{k: res[k] for k in ("wall_s", "val_loss", "sample")}}
        print(f"{name:16s} {steps:6d} steps  {tokens / 1e6:5.2f} M tokens  "
              f"{step_s * 1e3:6.1f} ms/step  wall {res['wall_s']:6.1f} s  "
              f"val {res['val_loss']:.4f}", flush=True)
        results[name]["curve"] = [(r["step"], r["val_loss"]) for r in res["records"]
                                  if "val_loss" in r]
    (root / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, root / "val_vs_time.png")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        xs = [s * r["step_s"] for s, _ in r["curve"]]
        ax.plot(xs, [v for _, v in r["curve"]], "o-", label=name, markersize=3)
    ax.set_xlabel("training seconds (steps × measured step time)")
    ax.set_ylabel("validation loss (nats/byte)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
