"""`phalanx plan --simulate`: rank r of an N-rank job, run in this one process.

torch's fake process group (`dist.init_process_group("fake")`: every collective returns at
once, with tensors of the right shapes) stands in for the other N-1 ranks, so the real
model and the real strategy — set up by `phalanx.init` and `run.setup`, stepped by the
trainer's own `micro_steps` and `optimizer_step`, as `phalanx.plan.measure` does — run
as that one rank at any N. Under torch's `FakeTensorMode` no tensor holds memory or
values, so a 7.5 B-parameter model is set up and stepped on a laptop; torch's memory
tracker (`MemTracker`) counts the bytes each tensor would take.

DDP (and ZeRO, which runs on it) cannot run on fake tensors: its C++ reducer reads the
parameters' data (shape checks, bucket rebuilding). They run on real tensors over the
fake group instead, when the plan says their peak fits `REAL_LIMIT`; otherwise they are
reported as not simulated (their per-rank memory does not depend on N except ZeRO's
optimizer share, which the formulas place by torch's own partitioning rule).

Every collective the step issues is recorded (a dispatch mode; DDP's bucket all-reduce
through a comm hook) with its size, and compared with the planner's communication.
The comparison, its explanations and the table are in `phalanx.plan.simulate_report`.
"""

from __future__ import annotations

import contextlib
import gc
import time
import traceback

from phalanx.errors import UserError
from phalanx.plan.estimate import VARIANTS, Variant
from phalanx.plan.measure import components, forward_backward_of, has_buckets, join, warmed_tracker
from phalanx.plan.simulate_world import count_hook, fake_tensors, fake_world, recorder

REAL_LIMIT = 4 << 30  # DDP/ZeRO run on real tensors up to this predicted peak
# torch loops over every rank in a step (ZeRO's broadcasts, all_gather_object's results,
# the ranks' shards): MiniGPT's default shape took 20-48 s up to N = 65,536, 78 s at
# 262,144 (1.2 GB), 351 s at 2**20 (3.6 GB), on 2 shared cores
MAX_WORLD = 1 << 16


def run_variant(cfg, variant: Variant, fake: bool, steps: int = 1) -> dict:
    """One variant as this rank of the fake world: {component: bytes at the peak, "peak",
    "moment", "collectives": [(op, bytes)…] of the tracked steps, "note": the strategy's
    own line (what FSDP sharded)}."""
    import torch

    from phalanx.models import build_model
    from phalanx.plan.recommend import planned_vocab
    from phalanx.runtime.optim import make_optimizer

    # this process's threads: the fake world's local ranks share no cores
    run = join(cfg, variant.strategy, variant.reshard, variant.layout,
               threads=torch.get_num_threads())
    vocab, rec = planned_vocab(cfg)[0], recorder()
    try:
        with fake_tensors() if fake else contextlib.nullcontext(), rec:
            net = build_model(cfg, vocab)
            model, opt = run.setup(net, lambda params: make_optimizer(
                cfg, net, params, run.device, vocab), precision=cfg.train.precision)
            if has_buckets(model):
                model.register_comm_hook(None, count_hook(rec.log))
            out = _tracked_steps(run, cfg, model, opt, vocab, rec, steps)
            out["checkpoint"] = save_plan_bytes(run, model, opt)
        out["note"] = run.strategy.note or ""
        out["shards"] = _shard_layout(model, variant.shard_ranks(run.world_size)) \
            if variant.sharded else {}
        return out
    finally:
        run.close()
        gc.collect()
        torch.manual_seed(cfg.train.seed)


def _tracked_steps(run, cfg, model, opt, vocab: int, recorder, steps: int) -> dict:
    """WARMUP untracked steps (optimizer state made, DDP's buckets rebuilt), then `steps`
    under the memory tracker: the peak's components, its moment and the collectives."""
    import torch

    from phalanx.runtime.train_step import optimizer_step

    t = cfg.train
    shape = (t.micro_batch_size, cfg.model.block_size)

    def batches():
        while True:
            x = torch.randint(0, vocab, shape, device=run.device)
            yield x, torch.roll(x, -1, 1)

    forward_backward = forward_backward_of(run, cfg, model, batches())
    tracker = warmed_tracker(run, cfg, model, opt, forward_backward)
    recorder.log.clear()
    with tracker:
        for _ in range(steps):
            forward_backward(tracker.reset_mod_stats)
            optimizer_step(run, model, opt, t.grad_clip)
    out = components(tracker.get_tracker_snapshot("peak")[run.device], has_buckets(model))
    out["moment"] = _moment(tracker, run.device, out["peak"])
    out["collectives"] = [(op, n // steps) for op, n in recorder.log]
    return out


def save_plan_bytes(run, model, opt) -> int | str:
    """Bytes of tensors in DCP's local save plan for this rank (`DefaultSavePlanner` on
    the strategy's `save_state`: what `run.save` hands DCP, replicated tensors already
    dealt one rank each), or why it could not be made."""
    from math import prod

    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType

    try:
        planner = DefaultSavePlanner()
        planner.set_up_planner(run.strategy.save_state(model, opt), None, run.rank == 0)
        plan = planner.create_local_plan()
    except Exception as exc:  # reported, not raised: the memory figures stand
        return f"no save plan: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    return sum(prod(i.tensor_data.chunk.sizes) * i.tensor_data.properties.dtype.itemsize
               for i in plan.items if i.type != WriteItemType.BYTE_IO and i.tensor_data)


def _moment(tracker, device, peak: int) -> str:
    """When the peak happened: the innermost module whose forward or backward peak is the
    step's peak ("backward, blocks.3.mlp"); none: outside every module's passes (the
    optimizer step, or the loss)."""
    from torch.distributed._tools.mem_tracker import _ModState

    best = None
    for stats in tracker.memory_tracking.values():
        for state, label in ((_ModState.PEAK_FW, "forward"), (_ModState.PEAK_BW, "backward")):
            for snap in stats.snapshots.get(state, []):
                if snap.get(device, {}).get("Total") == peak:
                    name = stats.mod_fqn.split(".", 1)[-1] if "." in stats.mod_fqn else "model"
                    if best is None or name.count(".") > best[1].count("."):
                        best = (label, name)
    return f"{best[0]}, {best[1]}" if best else "optimizer step (outside the model's passes)"


def _shard_layout(model, W: int) -> dict:
    """FSDP: per parameter (name → (dim 0, rows this rank holds, rows of an even 1/W)),
    for the parameters whose dim 0 does not split evenly over W ranks — the dim 0 FSDP
    splits: a tensor-parallel split of it (`Shard(0)` on the `tp` mesh dimension) first."""
    out = {}
    for name, p in model.named_parameters():
        local = getattr(p, "_local_tensor", None)
        if local is None or not p.dim():
            continue
        d0, rows = _fsdp_dim0(p), local.shape[0] if local.dim() else 0
        if d0 % W:
            out[name] = (d0, rows, d0 / W)
    return out


def _fsdp_dim0(p) -> int:
    """A sharded parameter's dim 0 as FSDP sees it: a TP rank's ⌈d0/T⌉ rows where the `tp`
    mesh dimension splits dim 0 (column-wise), the whole dim 0 otherwise."""
    d0, mesh = p.shape[0], p.device_mesh
    for i, (dim, placement) in enumerate(zip(mesh.mesh_dim_names or (), p.placements)):
        if dim == "tp" and getattr(placement, "dim", None) == 0:
            d0 = -(-d0 // mesh.size(i))
    return d0


def fullest_rank(cfg, v: Variant, W: int) -> int:
    """The rank the plan describes: 0 (ddp; fsdp, whose first ranks hold ⌈d0/W⌉ rows),
    or under zero the rank ZeroRedundancyOptimizer gives the most optimizer state
    (`formulas.zero_assignment`, torch's partitioning rule)."""
    from phalanx.plan import formulas as f
    from phalanx.plan.recommend import facts_for

    if v.sharded or "optimizer" not in v.shards:
        return 0
    facts = facts_for(cfg, variant=v)
    owner = f.zero_assignment(facts.param_shapes, W, facts.groups())
    held = [0] * W
    for shape, copies, r in zip(facts.param_shapes, facts.copies(), owner):
        held[r] += f.numel(shape) * copies
    return max(range(W), key=lambda r: held[r])


def simulate(cfg, world_size: int, variants: tuple[Variant, ...] = VARIANTS,
             rank: int | None = None, steps: int = 1, real_limit: int = REAL_LIMIT,
             predicted: dict | None = None) -> dict:
    """{"world_size", "variants": {label: figures (with its "rank"), or {"skipped": why}
    or {"failed": the one line}, each with its "variant"}}: each variant run as one rank
    of `world_size` in this process (see the module doc) — `rank`, or None: the rank the
    plan describes (`fullest_rank`).
    `predicted`: the plan's rows by label, to decide whether DDP/ZeRO fit `real_limit`
    on real tensors; None: they run on real tensors whatever their size."""
    from phalanx.config.sections import from_dict

    if cfg.train.precision == "fp16":
        raise UserError("`--simulate` runs fp32 or bf16 steps: fp16's loss scaler reads "
                        "the gradients' values to skip steps, and simulated tensors hold "
                        "none. Simulate with `--precision bf16` (the same memory).")
    out: dict = {"world_size": world_size, "variants": {}}
    for v in variants:
        gc.collect()  # the previous variant's model and optimizer (cycles in DDP's)
        r = fullest_rank(cfg, v, world_size) if rank is None else rank
        fake = v.sharded
        row = (predicted or {}).get(v.label)
        if not fake and row is not None and row["peak"] > real_limit:
            out["variants"][v.label] = {"skipped": (
                f"not simulated: {v.label} runs on real tensors (DDP's reducer reads its "
                f"parameters' data) and its planned peak, {row['peak'] / 2**30:.1f} GiB, "
                f"is over the {real_limit / 2**30:.0f} GiB allowed here"), "variant": v}
            continue
        start = time.perf_counter()
        with fake_world(world_size, r, cfg.dist.nproc_per_node):
            try:
                found = run_variant(from_dict(cfg.to_dict()), v, fake, steps)
            except UserError:
                raise
            except Exception as exc:  # the one line: what failed, where
                found = {"failed": _one_line(exc, v, world_size, r)}
        out["variants"][v.label] = {**found, "variant": v, "fake": fake, "rank": r,
                                    "seconds": time.perf_counter() - start}
    return out


def _one_line(exc: BaseException, v: Variant, W: int, rank: int) -> str:
    """What failed, where; and whether it is the job's failure or the simulation's own
    (an operation fake tensors cannot run says nothing about the real job)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    raised_in = traceback.extract_tb(exc.__traceback__)[-1].filename \
        if exc.__traceback__ else ""
    ours = type(exc).__module__.startswith(("torch._subclasses", "torch.fx")) or \
        "torch/_subclasses/" in raised_in.replace("\\", "/")
    whose = ("a limit of the simulation (fake tensors), not a finding about the job"
             if ours else "the real job fails here too")
    return (f"{v.label} failed as rank {rank} of {W}: {type(exc).__name__}: {first[:300]}"
            f" ({whose})")


def add_simulate_arguments(group) -> None:
    """`--simulate` and `--simulate-rank` in plan's option group."""
    group.add_argument("--simulate", action="store_true",
                       help="run the first steps of each strategy as one rank of the "
                            "planned world, in this process (torch's fake process group "
                            "and fake tensors: no memory, any N), and print simulated "
                            "beside predicted")
    group.add_argument("--simulate-rank", type=int, default=None, metavar="R",
                       help="the rank simulated (default: the rank the plan describes: "
                            "0, or under zero the one holding the most optimizer state)")


def check_world(world_size: int, rank: int | None) -> None:
    """Before anything is planned: a world `--simulate` finishes in reasonable time, and
    `--simulate-rank` one of its ranks."""
    if world_size > MAX_WORLD:
        raise UserError(f"`--simulate` at {world_size:,} ranks: it simulates at most "
                        f"{MAX_WORLD:,} (its time grows with the ranks: ~1 min at "
                        f"{MAX_WORLD:,} for MiniGPT's default shape). Simulate at "
                        f"`--world-size {MAX_WORLD}` or fewer; the plan without "
                        f"`--simulate` takes any world size.")
    if rank is not None and not 0 <= rank < world_size:
        raise UserError(f"`--simulate-rank {rank}` is not a rank of {world_size}: give "
                        f"0 … {world_size - 1}.")


def run_simulate(ns, cfg, world_size: int, plan_result: dict,
                 extra: tuple[Variant, ...] = ()) -> None:
    """Simulate every planned variant (VARIANTS and the `extra` layouts planned beside
    them) at `world_size`, compare with `plan_result`'s rows, and print (or, with
    `--json`, store the comparison in plan_result["simulated"])."""
    from phalanx.plan.simulate_report import compare_all, print_simulated

    if plan_result.get("model") != "MiniGPT":
        raise UserError("`--simulate` runs MiniGPT's training steps only (not yet a "
                        "`--model` factory's); measure your model on the local ranks with "
                        "`phalanx plan --model … --measure`.")
    rows = {r["strategy"]: r for r in plan_result["rows"]}
    found = simulate(cfg, world_size, VARIANTS + tuple(extra),
                     rank=getattr(ns, "simulate_rank", None), predicted=rows)
    plan_result["simulated"] = compare_all(cfg, found, rows)
    if not getattr(ns, "json", False):
        print_simulated(plan_result["simulated"])
