"""Your own model and data on Phalanx's API — the same calls the built-in trainer makes.

Runs as it is:
    python examples/train_own_model.py                                  # 1 process
    torchrun --standalone --nproc-per-node 2 examples/train_own_model.py  # 2 ranks (gloo on CPU)

It fits a small MLP to a noisy function, with epochs, gradient accumulation and a
validation loss averaged over all ranks. Nothing in it depends on the world size: no
set_device, no DistributedSampler, no set_epoch, no no_sync, no rank checks around saving.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

import phalanx


def make_data(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 8, generator=g) * 4 - 2
    y = torch.sin(x).sum(dim=1, keepdim=True) + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank, per micro-step")
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--out", default=None, help="save the final weights here")
    args = parser.parse_args()

    run = phalanx.init(seed=0)  # rank, device (pinned), backend, process group, threads
    with run:
        model = nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                              nn.Linear(64, 1))
        # move → wrap (DDP when several ranks) → optimizer, in that order
        model, opt = run.setup(model, lambda params: torch.optim.AdamW(params, lr=3e-3))
        train = run.loader(make_data(4096, seed=1), args.batch_size)  # sharded, reshuffled per epoch
        val = run.loader(make_data(512, seed=2), args.batch_size, shuffle=False)
        acc = run.accumulate(model, args.grad_accum)  # syncs gradients on the last micro-step only

        for epoch in range(args.epochs):
            for x, y in train:  # batches arrive on run.device
                with acc.micro_step():
                    acc.backward(nn.functional.mse_loss(model(x), y))
                if acc.boundary:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                local = sum(nn.functional.mse_loss(model(x), y).item() for x, y in val) / len(val)
            run.print(f"epoch {epoch + 1}/{args.epochs}  val mse {run.all_reduce_mean(local):.4f}"
                      f"  ({run.world_size} rank(s), {len(train)} batches/rank/epoch)")

        if args.out and run.is_main:
            torch.save(run.unwrap(model).state_dict(), args.out)  # the inner module's keys


if __name__ == "__main__":
    main()
