"""A MiniGPT trained in your own loop under any layout — pipeline stages included — with
one loop: `run.forward_backward` is the step's forward and backward whatever the layout.

    phalanx run --nproc-per-node 4 examples/train_pipeline.py --pp 2 --dp-shard 2
    phalanx run --nproc-per-node 4 examples/train_pipeline.py --pp 2 --tp 2
    phalanx run --nproc-per-node 2 examples/train_pipeline.py       (ddp: no pipeline)
    python examples/train_pipeline.py                                (one process)

The layout is the script's: its flags go to `phalanx.init(pp=, dp_shard=, tp=)`.
The batch of a data-parallel rank goes in whole; `microbatches` cuts it (the pipeline's
schedule runs them through the stages; without stages they are accumulation's
micro-steps). It resumes from OUT/checkpoints, under any layout, and writes the whole
model to OUT/model.pt on rank 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import phalanx
from phalanx.models import GPTConfig, MiniGPT


def batches(step: int, rows: int, rank: int, ranks: int, vocab: int, block: int):
    """This data-parallel rank's share of step `step`'s global batch (a toy task: count
    on from a random start, modulo the vocabulary)."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (rows * ranks, 1), generator=g)[rank * rows:(rank + 1) * rows]
    x = (start + torch.arange(block + 1)) % vocab
    return x[:, :-1], x[:, 1:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rows", type=int, default=8, help="sequences per data-parallel rank")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe"))
    p.add_argument("--out", type=Path, default=Path("runs/pipeline"))
    for dim in ("pp", "dp_shard", "dp_replicate", "tp"):
        p.add_argument("--" + dim.replace("_", "-"), type=int, default=None)
    args = p.parse_args()
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=32,
                    dropout=0.0, tie_embeddings=False)  # (stages share no weight)
    layout = {d: getattr(args, d) for d in ("pp", "dp_shard", "dp_replicate", "tp")
              if getattr(args, d) is not None}
    with phalanx.init(seed=0, out=args.out, **layout) as run:
        torch.manual_seed(0)
        model, opt = run.setup(MiniGPT(cfg), lambda params: torch.optim.AdamW(params, lr=3e-3))
        ckpt = run.out / "checkpoints"
        t = run.topology
        step = run.resume(ckpt, model, opt)
        while step < args.steps:
            x, y = batches(step, args.rows, t.dp_rank, t.dp_size, cfg.vocab_size,
                           cfg.block_size)
            loss = run.forward_backward(model, x, y, microbatches=args.microbatches,
                                        schedule=args.schedule)
            run.clip_grad_norm_(model, 1.0)
            run.step(opt)
            step += 1
            run.print(f"step {step}/{args.steps} loss {run.all_reduce_mean(loss.item()):.4f}")
            if step % 3 == 0:
                run.save(ckpt, step, model, opt)
        state = run.full_state_dict(model)
        if run.is_main:
            torch.save(state, run.out / "model.pt")
            run.print(f"wrote {run.out / 'model.pt'} ({len(state)} tensors)")


if __name__ == "__main__":
    main()
