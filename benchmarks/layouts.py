"""The layouts side by side on N gloo ranks (default 4): ddp (dp_replicate N), fsdp
(dp_shard N), HSDP (dp_replicate 2 × dp_shard N/2), tensor parallelism inside FSDP2 (tp 2
× dp_shard N/2, tp 2 × dp_replicate N/2), pipeline stages (pp 2 × dp_shard N/2, 1F1B over
2 micro-batches, through `run.forward_backward`), and three of them written by hand with
torch alone — HSDP (a 2-D DeviceMesh, `fully_shard`), tp × dp_shard (`parallelize_module`
with the model's plan, `fully_shard`, `loss_parallel`), pp × dp_shard (`PipelineStage`,
`Schedule1F1B`, `fully_shard`), torch's AdamW — per-rank memory
of the model states, measured with torch's trackers (`MemTracker`; `FSDPMemTracker` for
FSDP2), and the step time (median over the timed steps, with its interquartile range), in
one run.

Each layout is its own launch: `phalanx.init(strategy=..., dp_replicate=..., tp=...)`,
`run.setup` of MiniGPT + AdamW (fp32), warm-up steps, one tracked step, then the timed
steps (each ends with a barrier, so the slowest rank sets it). Every layout steps the same
global batch (2 × N sequences: 2 a data-parallel rank, 4 under tp 2 or pp 2, whose pair
of ranks shares one). Then each of Phalanx's layouts over its hand-written twin, paired by
round, with a bootstrap interval. Each round runs every layout once,
alternating the order.

    python benchmarks/layouts.py [--preset small] [--nproc 4] [--steps 10] [--rounds 3]
                                 [--json OUT]
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


TORCH_HSDP = "hsdp, torch only"  # the same layout by hand: DeviceMesh + fully_shard
TORCH_TP = "tp 2 × dp_shard, torch only"  # parallelize_module + fully_shard
TORCH_PP = "pp 2 × dp_shard, torch only"  # PipelineStage + Schedule1F1B + fully_shard
MICRO = 2  # pipeline micro-batches a step


def layouts(n: int) -> dict[str, dict | None]:
    """label → phalanx.init keywords (None: a hand-written torch script, `HAND`)."""
    return {"ddp": {"strategy": "ddp"}, "fsdp": {"strategy": "fsdp"},
            f"hsdp 2×{n // 2}": {"strategy": "fsdp", "dp_replicate": 2},
            f"tp 2 × dp_shard {n // 2}": {"tp": 2, "dp_shard": n // 2},
            f"tp 2 × dp_replicate {n // 2}": {"tp": 2, "dp_replicate": n // 2},
            f"pp 2 × dp_shard {n // 2}": {"pp": 2, "dp_shard": n // 2},
            TORCH_HSDP: None, TORCH_TP: None, TORCH_PP: None}


# Phalanx's layout each hand-written script is compared with (`versus_torch`)
PAIRS = {TORCH_HSDP: "hsdp 2×{h}", TORCH_TP: "tp 2 × dp_shard {h}",
         TORCH_PP: "pp 2 × dp_shard {h}"}


def worker(label: str, preset: str, steps: int, out: str) -> None:
    from phalanx.config.sections import build_config
    from phalanx.models import build_model

    n = int(os.environ["WORLD_SIZE"])
    cfg = build_config({"model": {"preset": preset}})
    keywords = layouts(n)[label]
    if keywords is None:
        return HAND[label](build_model(cfg), n, steps, out)
    import phalanx
    from phalanx.runtime.optim import adamw

    with phalanx.init(0, **keywords) as run:
        model, opt = run.setup(build_model(cfg), lambda p: adamw(
            p, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), device=run.device))
        per = 2 * n // run.topology.dp_size  # (the same global batch, 2 × n sequences)
        through = None if run.topology.pp_mesh is None else (  # the schedule, by the API
            lambda x: run.forward_backward(model, x, x, microbatches=MICRO))
        found, times = measured(model, opt, steps, run.strategy.sharded, per, through,
                                tracked=through is None)
        everyone = run.gather_objects(found)
        if run.is_main:
            Path(out).write_text(json.dumps({"label": run.strategy.label, "ranks": everyone,
                                             "times": times}))


def torch_hsdp(model, n: int, steps: int, out: str) -> None:
    """What a user writes without Phalanx: a (2, n/2) DeviceMesh, `fully_shard` on each
    block then the root, torch's AdamW (its defaults otherwise)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    found, times = measured(model, opt, steps, sharded=True)
    _write(found, times, n, out, "torch fully_shard (2-D mesh)")


def torch_tp(model, n: int, steps: int, out: str) -> None:
    """By hand: a (dp_shard, tp) DeviceMesh, `parallelize_module` with the model's plan
    (MiniGPT's `tp_plan`: what its author writes once), `fully_shard` over dp_shard on
    each block then the root, the loss under torch's `loss_parallel`."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import loss_parallel, parallelize_module

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("dp_shard", "tp"))
    model = parallelize_module(model, mesh["tp"], model.tp_plan(2))
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))

    def forward_backward(x):
        with loss_parallel():
            _, loss = model(x, x)
            loss.backward()

    found, times = measured(model, opt, steps, True, 2 * n // (n // 2), forward_backward)
    _write(found, times, n, out, "torch parallelize_module + fully_shard")


def torch_pp(model, n: int, steps: int, out: str) -> None:
    """By hand: a (pp, dp_shard) DeviceMesh, the model cut to this rank's stage (MiniGPT's
    `keep_stage`), `fully_shard` over dp_shard, torch's `PipelineStage` and
    `Schedule1F1B` over MICRO micro-batches, the loss on the last stage."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("pp", "dp_shard"))
    stage = mesh["pp"].get_local_rank()
    model.keep_stage(stage, 2)
    for block in model.blocks.values():
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    schedule = Schedule1F1B(
        PipelineStage(model, stage, 2, torch.device("cpu"), group=mesh["pp"].get_group()),
        n_microbatches=MICRO, scale_grads=True,
        loss_fn=lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten()))

    def forward_backward(x):
        if stage == 0:
            schedule.step(x)
        else:
            schedule.step(target=x, losses=[])

    found, times = measured(model, opt, steps, True, 2 * n // (n // 2), forward_backward,
                            tracked=False)
    _write(found, times, n, out, "torch PipelineStage + Schedule1F1B + fully_shard")


def _write(found: dict, times: list[float], n: int, out: str, label: str) -> None:
    import torch.distributed as dist

    everyone = [None] * n
    dist.all_gather_object(everyone, found)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"label": label, "ranks": everyone, "times": times}))
    dist.destroy_process_group()


def measured(model, opt, steps: int, sharded: bool, per: int = 2,
             forward_backward=None, tracked: bool = True) -> tuple[dict, list[float]]:
    """Two warm-up steps, one under torch's memory tracker (its peak by category), then
    `steps` timed ones, each ending in a barrier (the slowest rank sets it); `per`
    sequences of 64 tokens a step; `forward_backward(x)`: the step's forward and backward
    when it is not `model(x, x)` then `backward` (a pipeline schedule, a loss context);
    `tracked` False: no memory figures (torch's FSDPMemTracker refuses a module run twice
    in a step, as a pipeline's micro-batches run it)."""
    import torch
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    x = torch.randint(0, 256, (per, 64))

    def step():
        if forward_backward is not None:
            forward_backward(x)
        else:
            _, loss = model(x, x)
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    for _ in range(2):
        step()
    peak: dict = {}
    if tracked:
        tracker = FSDPMemTracker(model, opt) if sharded else MemTracker()
        if not sharded:
            tracker.track_external(model, opt)
        with tracker:
            step()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    return {str(k).split(".")[-1]: v for k, v in peak.items()}, times


def state(found: dict) -> float:
    """Parameters + gradients + optimizer state (sharded parts only), bytes."""
    return sum(v for k, v in found.items()
               if k in ("PARAM", "SHARDED_PARAM", "GRAD", "SHARDED_GRAD", "OPT"))


def summarise(results: dict, n: int, preset: str) -> list[str]:
    base = max(state(f) for f in results["ddp"]["ranks"])
    lines = [f"MiniGPT `{preset}`, fp32 AdamW, a global batch of {2 * n} × 64 tokens (2 "
             f"sequences a data-parallel rank; under tp 2, 4 a tp group), {n} gloo ranks; "
             f"model states per rank (the largest rank) and step time.", "",
             "| layout | strategy as run | params+grads+opt MiB | / ddp | peak MiB | "
             "step ms (median) | IQR ms |", "|---|---|---|---|---|---|---|"]
    for label, r in results.items():
        worst = max(r["ranks"], key=state)
        q = statistics.quantiles(r["times"], n=4)
        memory = (f"{state(worst) / MiB:.2f} | {state(worst) / base:.3f} | "
                  f"{worst.get('Total', 0) / MiB:.2f}" if worst else "— | — | —")
        lines.append(f"| {label} | {r['label']} | {memory} | "
                     f"{statistics.median(r['times']) * 1e3:.0f} | "
                     f"{q[0] * 1e3:.0f}–{q[2] * 1e3:.0f} |")
    return lines


def versus_torch(rounds: list[dict], n: int) -> list[str]:
    """Each of Phalanx's layouts against the same layout by hand: the per-round medians'
    paired ratio, with its bootstrap 95 % interval (phalanx.bench.stats), and the verdict
    "not slower" (ratio <= 1.0)."""
    from phalanx.bench.stats import ratio_interval, verdict

    lines = [""]
    for hand, ours_label in PAIRS.items():
        label = ours_label.format(h=n // 2)
        ours = [statistics.median(r[label]["times"]) for r in rounds]
        theirs = [statistics.median(r[hand]["times"]) for r in rounds]
        mid, low, high = ratio_interval(ours, theirs)
        lines.append(f"Phalanx's {label} / {hand} step time: {mid:.3f} (95 % interval "
                     f"{low:.3f}–{high:.3f}, {len(rounds)} rounds, labels interleaved); not "
                     f"slower: {verdict(low, high, 1.0)}.")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3,
                        help="every layout once per round, in turn (paired ratios)")
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    args = parser.parse_args()
    if args.nproc < 4 or args.nproc % 2:
        parser.error("--nproc must be even and at least 4 (HSDP: 2 replicas of >= 2 shards)")
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            labels = list(layouts(args.nproc))
            rounds.append({})
            for label in labels if i % 2 == 0 else labels[::-1]:
                out = Path(tmp) / "result.json"
                rounds[-1][label] = launched(__file__, [label, args.preset, str(args.steps),
                                                        str(out)], out, args.nproc)
    if args.json:
        Path(args.json).write_text(json.dumps(rounds, indent=1))
    merged = {label: {**rounds[0][label], "times": [t for r in rounds for t in
                                                    r[label]["times"]]}
              for label in layouts(args.nproc)}
    print("\n".join(summarise(merged, args.nproc, args.preset)
                    + versus_torch(rounds, args.nproc)))


HAND = {TORCH_HSDP: torch_hsdp, TORCH_TP: torch_tp, TORCH_PP: torch_pp}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    else:
        main()
