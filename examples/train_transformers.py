"""A Hugging Face `transformers` model on Phalanx's API: a small GPT-2 built from its config
(nothing is downloaded), trained on bytes of text found on this machine (the source of
Python's `argparse` module), checkpointed, resumed and exported for `from_pretrained`.

Runs as it is (`pip install transformers` first):
    python examples/train_transformers.py                                    # 1 process
    torchrun --standalone --nproc-per-node 2 examples/train_transformers.py  # 2 ranks
    python examples/train_transformers.py --strategy fsdp --precision bf16 ...

Run it again with the same `--out` and more `--steps`: it continues from the newest
checkpoint (the model, the optimizer and the data's position), at any world size and
under any strategy. At the end `OUT/model/` holds what
`transformers.AutoModelForCausalLM.from_pretrained("OUT/model")` loads.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import transformers
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel

import phalanx


class ByteWindows(Dataset):
    """Non-overlapping windows of `block` bytes: the model's tokens are bytes (0..255)."""

    def __init__(self, data: bytes, block: int) -> None:
        self.data, self.block = torch.frombuffer(bytearray(data), dtype=torch.uint8), block

    def __len__(self) -> int:
        return len(self.data) // self.block

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i * self.block:(i + 1) * self.block].long()


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=8, help="per rank, per micro-step")
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--block", type=int, default=64, help="tokens (bytes) per sequence")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--strategy", choices=["ddp", "zero", "fsdp"], default=None,
                        help="default: ddp on several ranks, none on one")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--out", default="runs/transformers")
    return parser.parse_args()


def main() -> None:
    args = parse()
    transformers.logging.set_verbosity_error()  # its notes on a config built from scratch
    transformers.logging.disable_progress_bar()
    run = phalanx.init(seed=0, strategy=args.strategy, out=args.out)  # phalanx run: its --out
    out = run.out
    with run:
        config = GPT2Config(vocab_size=256, n_positions=args.block, n_embd=64, n_layer=2,
                            n_head=4, bos_token_id=10, eos_token_id=10)  # "\n"
        # move → wrap (DDP; FSDP per GPT2Block, found without naming it) → optimizer
        model, opt = run.setup(GPT2LMHeadModel(config),
                               lambda params: torch.optim.AdamW(params, lr=args.lr),
                               precision=args.precision)
        text = Path(argparse.__file__).read_bytes()
        loader = run.loader(ByteWindows(text, args.block), args.batch_size, stream=True)
        start = run.resume(out / "checkpoints", model, opt, loader=loader)  # 0: none yet
        acc = run.accumulate(model, args.grad_accum)  # autocast; gradient sync on the last
        batches, began = iter(loader), time.perf_counter()
        for step in range(start, args.steps):
            for _ in range(args.grad_accum):
                x = next(batches)  # on run.device; this rank's share of the global batch
                with acc.micro_step():
                    loss = model(input_ids=x, labels=x).loss  # labels: shifted inside
                    acc.backward(loss)
            run.clip_grad_norm_(model, 1.0)  # fp16: unscaled first
            run.step(opt)  # fp16: through the loss scaler; then zero the gradients
            done = step + 1
            if done % args.log_every == 0 or done == args.steps:
                run.print(f"step {done}/{args.steps} | loss {run.all_reduce_mean(loss.item()):.4f}"
                          f" | {time.perf_counter() - began:.1f} s")
            if done % args.save_every == 0 or done == args.steps:
                run.save(out / "checkpoints", done, model, opt, loader=loader)
        path = run.export(model, out / "model")  # every rank calls it; rank 0 writes
        run.print(f"exported: {path} (AutoModelForCausalLM.from_pretrained('{path}'))")


if __name__ == "__main__":
    main()
