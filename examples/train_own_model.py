"""Your own model and data on Phalanx's API — the same calls the built-in trainer makes.

Runs as it is:
    python examples/train_own_model.py                                    # 1 process
    torchrun --standalone --nproc-per-node 2 examples/train_own_model.py  # 2 ranks (gloo on CPU)
    phalanx run --nproc-per-node 2 --out runs/own examples/train_own_model.py

It fits a small MLP to a noisy function, with epochs, gradient accumulation, dropout and
a validation loss averaged over all ranks. Kill it at any moment and run the same command
again: it resumes from its newest checkpoint, and the final weights are bit-identical to
an uninterrupted run's. Nothing in it depends on the world size: no set_device, no
DistributedSampler, no set_epoch, no no_sync, no rank checks around saving, no sample
counting for the resume.
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
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--save-every", type=int, default=20, help="optimizer steps")
    parser.add_argument("--out", default="runs/own-model",
                        help="run directory: checkpoints/ and weights.pt (under `phalanx "
                             "run`, its --out)")
    args = parser.parse_args()

    run = phalanx.init(seed=0, out=args.out)  # rank, device (pinned), process group, threads
    with run:
        torch.manual_seed(0)  # the same initial weights on every run (DDP broadcasts rank 0's)
        model = nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Dropout(0.05), nn.Linear(64, 64),
                              nn.GELU(), nn.Linear(64, 1))
        # move → wrap (DDP when several ranks) → optimizer, in that order
        model, opt = run.setup(model, lambda params: torch.optim.AdamW(params, lr=3e-3),
                               precision=args.precision)
        train = run.loader(make_data(4096, seed=1), args.batch_size)  # sharded, reshuffled per epoch
        val = run.loader(make_data(512, seed=2), args.batch_size, shuffle=False)
        acc = run.accumulate(model, args.grad_accum)  # syncs gradients on the last micro-step only
        ckpt = run.out / "checkpoints"
        step = run.resume(ckpt, model, opt, loader=train)  # 0, or the newest committed step

        for epoch in range(train.epoch, args.epochs):  # a resumed run goes on mid-epoch
            model.train()
            for x, y in train:  # batches arrive on run.device
                # dropout masks from (seed, step, micro-step, rank): replayed on resume
                with acc.micro_step():
                    acc.backward(nn.functional.mse_loss(model(x), y))
                if acc.boundary:
                    run.clip_grad_norm_(model, 1.0)
                    run.step(opt)  # counts the step the micro-steps seed from
                    step += 1
                    if step % args.save_every == 0:
                        run.save(ckpt, step, model, opt, loader=train)
            model.eval()
            with torch.no_grad():
                local = sum(nn.functional.mse_loss(model(x), y).item() for x, y in val) / len(val)
            run.print(f"epoch {epoch + 1}/{args.epochs}  val mse {run.all_reduce_mean(local):.4f}"
                      f"  ({run.world_size} rank(s), {len(val)} val batches/rank)")

        if run.is_main:  # the inner module's keys
            torch.save(run.unwrap(model).state_dict(), run.out / "weights.pt")


if __name__ == "__main__":
    main()
