"""`phalanx plan --measure`: a few training steps of each planned strategy on the local
ranks, with torch's own memory tracker (`torch.distributed._tools.mem_tracker`, which
works on CPU tensors too; CUDA memory stats are the same source on a GPU), and the step
time. The steps are the trainer's own (`run.setup`, `micro_steps`, `optimizer_step`), on
random tokens of the planned shape: memory does not depend on what the tokens say.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from phalanx.cluster.env import global_rank
from phalanx.config.sections import from_dict
from phalanx.runtime.choice import choose_here

WARMUP = 3  # DDP rebuilds its buckets in the third step
# MemTracker's categories at the peak → the planner's components
CATEGORIES = {"PARAM": "parameters", "BUFFER": "parameters", "GRAD": "gradients",
              "OPT": "optimizer", "ACT": "activations", "TEMP": "activations",
              "OTH": "buffers"}


def join(cfg, strategy: str, reshard: bool = True, layout: dict | None = None,
         threads: int | None = None):
    """`phalanx.init` for `strategy` with the config's options (chosen as the trainer
    chooses, for the world this process joins), over the whole world or on the `layout`
    mesh ({"dp_replicate": R, "dp_shard": -1}); the process group made by the first call
    is reused by the next (a strategy is set up on the same ranks)."""
    import phalanx

    cfg.dist.strategy = strategy
    cfg.dist.fsdp_reshard_after_forward = reshard
    for dim, size in (layout or {}).items():
        setattr(cfg.dist, dim, size)
    return phalanx.init(cfg.train.seed, backend=cfg.dist.backend, threads=threads,
                        strategy=choose_here(cfg.dist, cfg.train.grad_accum),
                        straggler_every=0)  # (steps measured, not judged)


def measure(run, cfg, steps: int = 3) -> dict:
    """{component: bytes at the peak, "peak": bytes, "step_s": median step time} on this
    rank, over `steps` optimizer steps after WARMUP untracked ones (optimizer state made,
    DDP's buckets in their final layout)."""
    import torch

    from phalanx.models import build_model
    from phalanx.plan.recommend import planned_vocab
    from phalanx.runtime.optim import make_optimizer
    from phalanx.runtime.train_step import optimizer_step

    t = cfg.train
    gen = torch.Generator().manual_seed(run.rank)
    shape = (t.micro_batch_size, cfg.model.block_size)
    vocab = planned_vocab(cfg)[0]  # the tokenizer's, as the plan counts it

    def batches():
        while True:
            x = torch.randint(0, vocab, shape, generator=gen).to(run.device)
            yield x, torch.roll(x, -1, 1)

    net = build_model(cfg, vocab)
    # the trainer's optimizer (`--optimizer`), over the wrapped model's parameters
    model, opt = run.setup(net, lambda params: make_optimizer(
        cfg, net, params, run.device, vocab), precision=t.precision)
    forward_backward = forward_backward_of(run, cfg, model, batches())
    tracker = warmed_tracker(run, cfg, model, opt, forward_backward)
    times = []
    with tracker:
        for _ in range(steps):
            start = time.perf_counter()
            # (per-module records cleared between micro-steps and steps; the peak is kept)
            forward_backward(tracker.reset_mod_stats)
            optimizer_step(run, model, opt, t.grad_clip)
            times.append(time.perf_counter() - start)
            tracker.reset_mod_stats()
    out: dict[str, float] = components(tracker.get_tracker_snapshot("peak")[run.device],
                                       has_buckets(model))
    if run.topology.pp_mesh is not None:  # the receive buffers (tracked as "other"): the
        # plan's communication, compared with the activations (plan.compare)
        out["activations"] += out["buffers"]
        out["buffers"] = 0
    timed = times[1:] or times
    out["step_s"] = sorted(timed)[len(timed) // 2]
    return out


def forward_backward_of(run, cfg, model, data):
    """One optimizer step's forward and backward, as the trainer runs it: the
    accumulation window's micro-steps, or under pipeline stages the schedule over as many
    micro-batches (`train.loop`). Called with what to run between two micro-steps."""
    from phalanx.runtime.train_step import micro_steps, pipeline_steps

    t = cfg.train
    if run.topology.pp_mesh is not None:
        return lambda between=None: pipeline_steps(run, model, data, t.grad_accum,
                                                   cfg.dist.pp_schedule)
    acc = run.accumulate(model, t.grad_accum)
    return lambda between=None: micro_steps(model, acc, data, run.precision, between=between)


def warmed_tracker(run, cfg, model, opt, forward_backward):
    """WARMUP untracked steps (optimizer state made, DDP's buckets rebuilt, a pipeline's
    receive buffers made: steady state), then a MemTracker that also follows what it
    cannot find by itself: ZeRO's state in its inner, local optimizer (not in the
    ZeroRedundancyOptimizer), the gradients' storage that outlives zero_grad (DDP's
    buckets: the gradients are views into them) and a pipeline stage's receive buffers,
    tracked from the start as "other" memory."""
    from phalanx.plan.stage_tracker import StageTracker, receive_buffers
    from phalanx.runtime.train_step import optimizer_step

    grads: list = []
    for _ in range(WARMUP):
        forward_backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        optimizer_step(run, model, opt, cfg.train.grad_clip)
    tracker = StageTracker()
    inner = run.strategy.local_optimizer(opt)
    tracker.track_external(model, opt, *([inner] if inner is not opt else []),
                           *(grads if has_buckets(model) else []),
                           *receive_buffers(run, model))
    return tracker


def components(snap: dict, buckets: bool) -> dict:
    """MemTracker's categories at the peak → the planner's components, and "peak"."""
    out: dict = dict.fromkeys(sorted(set(CATEGORIES.values())), 0)
    for kind, value in snap.items():
        name = str(kind).rsplit(".", 1)[-1]
        if name in CATEGORIES:
            out[CATEGORIES[name]] += int(value)
    if buckets:  # DDP's buckets are where its gradients live
        out["gradients"] += out.pop("buffers")
        out["buffers"] = 0
    out["peak"] = int(snap["Total"])
    return out


def has_buckets(model) -> bool:
    """DDP (and ZeRO, which runs on it): gradients are views into its buckets."""
    return hasattr(model, "_get_ddp_logging_data")


def worker(spec_path: str) -> int:
    """One rank of the measuring job: every variant in turn on one process group; rank 0
    writes, per variant, the rank with the highest peak."""
    import gc


    spec = json.loads(Path(spec_path).read_text())
    results, first = {}, None
    for label, strategy, reshard, layout in spec["variants"]:
        cfg = from_dict(spec["config"])
        run = join(cfg, strategy, reshard, layout)
        first = first or run
        mine = {**measure(run, cfg, spec["steps"]), "rank": run.rank}
        results[label] = max(run.gather_objects(mine), key=lambda r: r["peak"])
        run.strategy.release()
        gc.collect()
    assert first is not None  # the spec names every planned variant (plan.compare.VARIANTS)
    first.close()
    if global_rank() == 0:
        Path(spec["result"]).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(worker(sys.argv[1]))
