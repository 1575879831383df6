"""Per-rank memory of ddp, zero and fsdp, measured with torch's own memory trackers
(`torch.distributed._tools.mem_tracker.MemTracker`, and `FSDPMemTracker` for FSDP2, which
also separates sharded from transient unsharded tensors). Works on CPU.

Each strategy runs in its own launch (N gloo ranks): `run.setup` of MiniGPT + AdamW
(fp32), one untracked step (creates the optimizer state), then one tracked step; every
rank reports the tracker's peak per category. Printed: the largest rank's figures, and the ZeRO paper's per-parameter accounting for fp32 Adam as the
reference: DDP 16Ψ bytes per rank (4 params + 4 grads + 8 moments), ZeRO-1 8Ψ + 8Ψ/N,
FSDP (ZeRO-3) 16Ψ/N. (For mixed-precision Adam the paper's numbers are 16Ψ, 4Ψ + 12Ψ/N,
16Ψ/N.)

    python benchmarks/sharded_memory.py [--preset small] [--nproc 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STRATEGIES = ("ddp", "zero", "fsdp")
MiB = 2 ** 20


def worker(strategy: str, preset: str, out: str) -> None:
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    import phalanx
    from phalanx.config.sections import build_config
    from phalanx.models import build_model
    from phalanx.runtime.optim import adamw

    with phalanx.init(0, strategy=strategy) as run:
        cfg = build_config({"model": {"preset": preset}})
        model, opt = run.setup(build_model(cfg), lambda p: adamw(
            p, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device=run.device))
        psi = sum(p.numel() for p in build_model(cfg).parameters())
        x = torch.randint(0, 256, (2, 64))

        def step():
            _, loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay allocated: count them

        step()
        tracker = FSDPMemTracker(model, opt) if run.strategy.sharded else MemTracker()
        if not run.strategy.sharded:  # ZeRO: the optimizer over this rank's partition
            tracker.track_external(model, run.strategy.local_optimizer(opt))
        with tracker:
            step()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
        found = {str(k).split(".")[-1]: v for k, v in peak.items()}
        everyone = run.gather_objects(found)
        if run.is_main:
            Path(out).write_text(json.dumps({"psi": psi, "world": run.world_size,
                                             "ranks": everyone}))


def category(found: dict, *names: str) -> float:
    return sum(v for k, v in found.items() if k in names)


def summarise(results: dict) -> list[str]:
    n, psi = results["ddp"]["world"], results["ddp"]["psi"]
    expect = {"ddp": 16 * psi, "zero": 8 * psi + 8 * psi / n, "fsdp": 16 * psi / n}

    def state(found):  # parameters + gradients + optimizer state, sharded parts only
        return category(found, "PARAM", "SHARDED_PARAM") + \
            category(found, "GRAD", "SHARDED_GRAD") + category(found, "OPT")

    worst = {s: max(results[s]["ranks"], key=state) for s in results}
    base = state(worst["ddp"])
    lines = [f"MiniGPT Ψ = {psi:,} parameters, fp32 AdamW, {n} ranks; MiB per rank (the "
             f"largest rank), torch's memory trackers, peak of one step.", "",
             "| strategy | params | grads | optimizer | params+grads+opt | / ddp | ZeRO-paper "
             "reference | transient (unsharded params+grads, all-gather, reduce-scatter) "
             "| peak total |", "|---|---|---|---|---|---|---|---|---|"]
    for s in STRATEGIES:
        f = worst[s]
        params = category(f, "PARAM", "SHARDED_PARAM")
        grads = category(f, "GRAD", "SHARDED_GRAD")
        transient = category(f, "UNSHARDED_PARAM", "UNSHARDED_GRAD", "ALL_GATHER",
                             "REDUCE_SCATTER")
        lines.append(f"| {s} | {params / MiB:.2f} | {grads / MiB:.2f} | "
                     f"{category(f, 'OPT') / MiB:.2f} | {state(f) / MiB:.2f} | "
                     f"{state(f) / base:.3f} | {expect[s] / MiB:.2f} ({expect[s] / expect['ddp']:.3f}) | "
                     f"{transient / MiB:.2f} | {f.get('Total', 0) / MiB:.2f} |")
    zero_opt = category(worst["zero"], "OPT") / category(worst["ddp"], "OPT")
    fsdp_all = state(worst["fsdp"]) / base
    lines += ["", f"fsdp params+grads+opt / ddp = {fsdp_all:.3f} (goal <= 1/{n} + 10 % = "
                  f"{1 / n + 0.1:.3f}: {'met' if fsdp_all <= 1 / n + 0.1 else 'missed'}); zero "
                  f"optimizer state / ddp = {zero_opt:.3f} (goal <= {1 / n + 0.1:.3f}: "
                  f"{'met' if zero_opt <= 1 / n + 0.1 else 'missed'})."]
    return lines



def launched(script: str, worker_args: list[str], out: Path, nproc: int) -> dict:
    """`script --worker *worker_args` on `nproc` ranks under torch's elastic agent (one
    thread each), in a fresh interpreter: the JSON its rank 0 wrote to `out`."""
    code = ("from phalanx.launch.agent import launch_workers; launch_workers("
            f"[{script!r}, '--worker', *{worker_args!r}], {nproc}, threads=1)")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return json.loads(out.read_text())

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for s in STRATEGIES:
            out = Path(tmp) / f"{s}.json"
            results[s] = launched(__file__, [s, args.preset, str(out)], out, args.nproc)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print("\n".join(summarise(results)))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    else:
        main()
