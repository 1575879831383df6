"""`phalanx plan` against measurement: every strategy variant, with and without
activation checkpointing, for the `tiny` and `small` presets (fp32 and bf16) and a
larger shape, on 2 gloo ranks on CPU. Prints one markdown table (the one in docs/plan.md).

    python benchmarks/plan_vs_measured.py [--world-size 2] [--steps 2]
"""

from __future__ import annotations

import argparse

from phalanx.config.sections import build_config
from phalanx.plan.compare import measure_locally
from phalanx.plan.devices import device
from phalanx.plan.recommend import facts_for, plan

SHAPES = {
    "tiny (mb 16)": {"model": {"preset": "tiny"}, "train": {"micro_batch_size": 16}},
    "small (mb 4)": {"model": {"preset": "small"}, "train": {"micro_batch_size": 4}},
    "tiny, bf16 (mb 16)": {"model": {"preset": "tiny"},
                           "train": {"micro_batch_size": 16, "precision": "bf16"}},
    "small, bf16 (mb 4)": {"model": {"preset": "small"},
                           "train": {"micro_batch_size": 4, "precision": "bf16"}},
    "8L×512d×8H, T 256 (mb 4)": {"model": {"n_layer": 8, "n_embd": 512, "n_head": 8,
                                           "block_size": 256},
                                 "train": {"micro_batch_size": 4}},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    print("| shape | AC | strategy | peak MiB predicted / measured | peak ratio | params | "
          "grads | optimizer | activations+comm | all within band |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, overrides in SHAPES.items():
        for ac in (False, True):
            model = {**overrides["model"], "activation_checkpointing": ac}
            cfg = build_config({**overrides, "model": model})
            facts_for(cfg)  # the shape is valid before anything is launched
            result = plan(cfg, args.world_size, device(None), 0.4, None, None)
            measured = measure_locally(cfg, args.world_size, args.steps, result["rows"])
            for name, m in measured.items():
                ratios = [_r(m[c]) for c in ("parameters", "gradients", "optimizer",
                                             "activations")]
                ok = all(m[c]["within"] for c in ("parameters", "gradients", "optimizer",
                                                  "activations", "peak"))
                print(f"| {label} | {'on' if ac else 'off'} | {name} | "
                      f"{m['peak']['predicted'] / 2**20:.1f} / "
                      f"{m['peak']['measured'] / 2**20:.1f} | {m['peak']['ratio']:.3f} | "
                      f"{' | '.join(ratios)} | {'yes' if ok else 'NO'} |", flush=True)


def _r(c: dict) -> str:
    if c["ratio"] is None:
        return f"{c['predicted'] / 2**20:.2f}/0"
    return f"{c['ratio']:.3f}"


if __name__ == "__main__":
    main()
