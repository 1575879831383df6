"""Conformance script: Lightning Fabric (benchmarks/conformance; see common.py).

Written the way Fabric's docs save and resume:
- https://lightning.ai/docs/fabric/stable/guide/checkpoint/checkpoint.html ("Define the
  state of your program": a dict of model, optimizer, scheduler and the loop's counters;
  `fabric.save(path, state)`; `fabric.load(path, state)` restores in place and returns
  the rest);
- https://lightning.ai/docs/fabric/stable/advanced/gradient_accumulation.html
  (`fabric.no_backward_sync(model, enabled=is_accumulating)`);
- https://lightning.ai/docs/fabric/stable/api/fabric_methods.html (`setup`,
  `setup_dataloaders`: Fabric inserts a DistributedSampler seeded from `PL_GLOBAL_SEED`,
  i.e. `fabric.seed_everything`, and sets its epoch on each `iter()`).

Fabric's docs say nothing about the position inside an epoch (nor does its example
trainer, examples/fabric/build_your_own_trainer, which checkpoints at epoch ends): the
state holds the step and the epoch, and a resumed run restarts that epoch's loader from
its first batch, and the sampler's epoch comes from the loader wrapper's own count of
`iter()` calls (lightning_fabric/wrappers.py, _FabricDataLoader.__iter__), which starts at
0 in the new process. That is what a user following the guide gets.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def latest_checkpoint(directory: Path) -> Path | None:
    files = list(directory.glob("step-*.ckpt")) if directory.is_dir() else []
    return common.latest_or_fresh(files, lambda p: int(p.stem.split("-")[1]), "fabric",
                                  directory)


def main() -> None:
    args = common.parser("fabric").parse_args()
    out = Path(args.out)
    checkpoints = out / "checkpoints"
    try:
        fabric = Fabric(accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", "1")),
                        num_nodes=1, strategy=args.strategy)
    except ValueError as error:
        if args.strategy != "fsdp":
            raise
        common.refuse(f"Fabric(strategy={args.strategy!r}, accelerator='cpu'): {error}")
    fabric.launch()
    fabric.seed_everything(args.seed)
    trace = common.Trace(out, fabric.global_rank, args.life)

    model = common.make_model(args.dropout)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = fabric.setup(model, optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
    loader = fabric.setup_dataloaders(
        DataLoader(common.IndexedData(), batch_size=args.batch_size,
                   shuffle=not args.no_shuffle, num_workers=args.workers))

    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
             "step": 0, "epoch": 0}
    if args.resume:
        path = latest_checkpoint(checkpoints)
        if path is not None:
            remainder = fabric.load(path, state)
            fabric.print(f"resumed from {path}; not restored: {sorted(remainder)}")

    kill_pending = False
    for epoch in range(state["epoch"], args.epochs):
        state["epoch"] = epoch
        model.train()
        for batch_idx, (indices, x, y) in enumerate(loader):
            is_accumulating = (batch_idx + 1) % args.grad_accum != 0 and batch_idx + 1 < len(loader)
            with fabric.no_backward_sync(model, enabled=is_accumulating):
                loss = common.loss_fn(model(x), y)
                fabric.backward(loss / args.grad_accum)
            trace.micro(indices, loss)
            if kill_pending:
                common.kill_now()
            if is_accumulating:
                continue
            optimizer.step()
            if args.scheduler:
                scheduler.step()
            optimizer.zero_grad()
            state["step"] += 1
            trace.step(state["step"])
            if args.checkpoint_every and state["step"] % args.checkpoint_every == 0:
                # The epoch to resume in is this one unless its last batch just ran.
                state["epoch"] = epoch + 1 if batch_idx + 1 == len(loader) else epoch
                fabric.save(checkpoints / f"step-{state['step']}.ckpt", state)
                state["epoch"] = epoch
            if state["step"] == args.kill_after_step:
                kill_pending = True
    if kill_pending:  # step K was the last one: nothing left to run
        common.kill_now()

    fabric.barrier()
    if fabric.global_rank == 0:
        common.save_final(out, model.state_dict())


if __name__ == "__main__":
    main()
