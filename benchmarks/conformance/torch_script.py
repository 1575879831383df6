"""The conformance task (common.py) in hand-written torch, the way its docs say:

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/conformance/torch_script.py --out OUT [common.parser() flags]

`init_process_group("gloo")`, a `DistributedSampler` under torchdata's
`StatefulDataLoader`, DDP or FSDP2 (`fully_shard`), and a checkpoint of
`torch.distributed.checkpoint` (model, optimizer and scheduler through
`get_state_dict`/`set_state_dict`) with, beside it, each rank's loader state, RNG state,
epoch and step (`extra-rank{R}.pt`). A checkpoint counts once rank 0 has written `latest`
after every rank wrote its part. Nothing more than a careful user would write: no handling
of another world size (each rank loads the file of its own rank number).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def build(args, rank: int, world: int):
    model = common.make_model(args.dropout)
    if args.strategy == "fsdp":
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7) \
        if args.scheduler else None
    sampler = DistributedSampler(common.IndexedData(), num_replicas=world, rank=rank,
                                 shuffle=not args.no_shuffle, seed=args.seed)
    loader = StatefulDataLoader(common.IndexedData(), batch_size=args.batch_size,
                                sampler=sampler, num_workers=args.workers)
    return model, opt, sched, sampler, loader


def save(root: Path, step: int, epoch: int, model, opt, sched, loader, rank: int) -> None:
    where = root / f"step-{step:05d}"
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    if sched is not None:
        state["scheduler"] = sched.state_dict()
    dcp.save(state, checkpoint_id=str(where))
    torch.save({"step": step, "epoch": epoch, "loader": loader.state_dict(),
                "rng": torch.get_rng_state()}, where / f"extra-rank{rank}.pt")
    dist.barrier()
    if rank == 0:  # committed: every rank wrote its part
        (root / "latest.tmp").write_text(where.name)
        os.replace(root / "latest.tmp", root / "latest")


def load(root: Path, model, opt, sched, loader, rank: int) -> tuple[int, int]:
    """(step, epoch) of the latest committed checkpoint, its state loaded; (0, 0) without."""
    if not (root / "latest").exists():
        return 0, 0
    where = root / (root / "latest").read_text().strip()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    if sched is not None:
        state["scheduler"] = sched.state_dict()
    dcp.load(state, checkpoint_id=str(where))
    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    if sched is not None:
        sched.load_state_dict(state["scheduler"])
    extra = torch.load(where / f"extra-rank{rank}.pt", weights_only=False)
    loader.load_state_dict(extra["loader"])
    torch.set_rng_state(extra["rng"])
    return extra["step"], extra["epoch"]


def no_sync(model, args, last: bool):
    """Gradient sync on the window's last micro-batch only."""
    if args.strategy == "fsdp":
        model.set_requires_gradient_sync(last)
        return _Nothing()
    return _Nothing() if last else model.no_sync()


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def train(args, rank: int, world: int) -> None:
    model, opt, sched, sampler, loader = build(args, rank, world)
    root = Path(args.out) / "checkpoints"
    step, start_epoch = load(root, model, opt, sched, loader, rank) if args.resume else (0, 0)
    trace = common.Trace(args.out, rank, args.life)
    micro, dying = 0, False
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for index, x, y in loader:
            micro += 1
            last = micro % args.grad_accum == 0
            with no_sync(model, args, last):
                loss = common.loss_fn(model(x), y)
                (loss / args.grad_accum).backward()
            trace.micro(index, loss)
            if dying:
                common.kill_now()
            if not last:
                continue
            opt.step()
            opt.zero_grad()
            step += 1
            if sched is not None:
                sched.step()
            trace.step(step)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save(root, step, epoch, model, opt, sched, loader, rank)
            dying = step == args.kill_after_step
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    if rank == 0:
        common.save_final(args.out, state)


def main() -> None:
    args = common.parser("torch").parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)  # dropout: each rank its own masks
    Path(args.out).mkdir(parents=True, exist_ok=True)
    try:
        train(args, rank, world)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
