"""Time to quality of `phalanx train`'s main job: candidate recipes at one wall-clock budget.

Each candidate (tokenizer, and one of the GPT-2 speedrun's levers at a time, then all
together) is first timed for 50 steps — all candidates back to back, before any long
run — its step count is set so that training fills the budget, and then it trains end to
end through the real CLI (2 gloo ranks by default, the embedded corpus). Equal wall time,
not equal steps. Printed: steps, tokens, tokens/s, wall time of the whole command, final
validation loss in nats/token and nats/byte (the same validation text whatever the
tokenizer, ~64 K tokens per evaluation); written: results.json and val_vs_time.png.

    python benchmarks/time_to_quality.py [--budget-s 125] [--only A,B] [--out runs/ttq]
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
SHAPE = dict(block_size=64, micro_batch_size=8, lr=2e-3, min_lr=2e-4, warmup_steps=50)
BPE = {**SHAPE, "tokenizer": "bpe:4096"}
LEVERS = {"rope": True, "qk_norm": True, "activation": "relu2", "tie_embeddings": False,
          "logit_softcap": 30.0, "optimizer": "muon"}
CANDIDATES = {  # name: (flags, fixed steps or None: fill the budget)
    "bytes (previous default)": ({**SHAPE, "tokenizer": "bytes"}, None),
    "bpe:2048": ({**SHAPE, "tokenizer": "bpe:2048"}, None),
    "bpe:4096": (BPE, None),
    "bpe:8192": ({**SHAPE, "tokenizer": "bpe:8192"}, None),
    "bpe:4096 +rope": ({**BPE, "rope": True}, None),
    "bpe:4096 +qk-norm": ({**BPE, "qk_norm": True}, None),
    "bpe:4096 +relu2": ({**BPE, "activation": "relu2"}, None),
    "bpe:4096 +untied": ({**BPE, "tie_embeddings": False}, None),
    "bpe:4096 +softcap": ({**BPE, "logit_softcap": 30.0}, None),
    "bpe:4096 +muon": ({**BPE, "optimizer": "muon"}, None),
    "bpe:4096 +wsd": ({**BPE, "lr_schedule": "wsd"}, None),
    "bpe:4096 all levers": ({**BPE, **LEVERS, "lr_schedule": "wsd"}, None),
}


def flags(values: dict) -> list[str]:
    out = []
    for key, value in values.items():
        flag = f"--{key.replace('_', '-')}"
        if value is True or value is False:
            out.append(flag if value else f"--no-{flag[2:]}")
        else:
            out += [flag, str(value)]
    return out


def train(out: Path, recipe: dict, steps: int, nproc: int, extra: list[str]) -> dict:
    """One `phalanx train` run; its wall time, final validation loss and metrics."""
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
    val = [r for r in records if "val_loss" in r]
    return {"wall_s": wall, "val_loss": val[-1]["val_loss"], "records": records,
            "nats_per_byte": val[-1].get("val_nats_per_byte", val[-1]["val_loss"]),
            "sample": (out / "sample.txt").read_text(errors="replace")
            if (out / "sample.txt").exists() else ""}


def calibrate(out: Path, recipe: dict, nproc: int) -> float:
    """Median seconds per step over 40 steps (after the first 10)."""
    res = train(out, recipe, 50, nproc, ["--eval-every", "1000", "--log-every", "1",
                                         "--sample-tokens", "0", "--checkpoint-every", "0"])
    times = [r["step_time_s"] for r in res["records"] if r.get("step", 0) > 10
             and "step_time_s" in r]
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=125.0,
                        help="training seconds to fill (default: 125; start-up, "
                             "evaluations and outputs come on top)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated candidate names")
    parser.add_argument("--out", default="runs/ttq")
    parser.add_argument("--timings-only", action="store_true",
                        help="time the candidates (OUT/timings.json) and stop")
    parser.add_argument("--reuse-timings", action="store_true",
                        help="use OUT/timings.json where it has the candidate")
    parser.add_argument("--retime", action="store_true",
                        help="time every candidate again; keep the faster of the two")
    args = parser.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only else list(CANDIDATES)
    # every candidate timed first, back to back (the tokenizers' caches built before);
    # the timings are kept, so `--reuse-timings` trains at the same step counts again (the
    # losses do not depend on the machine's load, the step times do)
    saved = root / "timings.json"
    step_s = json.loads(saved.read_text()) if args.reuse_timings and saved.exists() else {}
    for i, name in enumerate(names):
        if name not in step_s or args.retime:  # timed again: the faster (less disturbed)
            took = calibrate(root / f"calibrate-{i}", CANDIDATES[name][0], args.nproc)
            step_s[name] = min(took, step_s.get(name, took))
            saved.write_text(json.dumps(step_s, indent=2))
    if args.timings_only:
        print(json.dumps(step_s, indent=2))
        return
    results = {}
    for i, name in enumerate(names):
        recipe, fixed = CANDIDATES[name]
        steps = fixed or int(args.budget_s / step_s[name])
        res = train(root / f"run-{i}", recipe, steps, args.nproc,
                    ["--eval-every", str(max(1, steps // 4)), "--checkpoint-every", str(steps)])
        tokens = steps * recipe["micro_batch_size"] * args.nproc * recipe["block_size"]
        tok_s = recipe["micro_batch_size"] * args.nproc * recipe["block_size"] / step_s[name]
        results[name] = {"recipe": recipe, "steps": steps, "step_s": step_s[name],
                         "tokens": tokens, "tokens_per_s": tok_s,
                         **{k: res[k] for k in ("wall_s", "val_loss", "nats_per_byte",
                                                "sample")}}
        print(f"{name:22s} {steps:6d} steps  {tokens / 1e6:5.2f} M tokens  "
              f"{tok_s:8,.0f} tok/s  wall {res['wall_s']:6.1f} s  "
              f"val {res['val_loss']:.4f} nats/token  {res['nats_per_byte']:.4f} nats/byte",
              flush=True)
        results[name]["curve"] = [(r["step"], r.get("val_nats_per_byte", r["val_loss"]))
                                  for r in res["records"] if "val_loss" in r]
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
