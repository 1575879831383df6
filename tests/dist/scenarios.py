"""Worker for the multi-process tests: one process group, several scenarios.

Launched by tests/dist/test_ddp.py through Phalanx's launcher (torch's elastic agent),
2 gloo ranks. Every scenario trains through the same `train()` the CLI uses and saves,
per rank, the final weights and the per-step losses to OUT/<scenario>-rank<r>.pt.
Usage: python scenarios.py OUT CORPUS SMALL_CORPUS CACHE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn

import phalanx
from phalanx.config.sections import build_config
from phalanx.data.corpus import prepare
from phalanx.errors import DistributedError
from phalanx.strategies.ddp import DDPStrategy
from phalanx.train.loop import train

from common import sgd_trajectory
from guard_scenarios import guard_scenarios
from resume_scenarios import two_rank_scenarios

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}


def config(micro_batch: int, accum: int, steps: int, strategy: str = "ddp"):
    return build_config({
        "model": TINY,
        "train": {"micro_batch_size": micro_batch, "grad_accum": accum, "max_steps": steps,
                  "warmup_steps": 2, "eval_every": 1000, "eval_batches": 1, "lr": 3e-3,
                  "min_lr": 3e-4, "seed": 7},
        "dist": {"strategy": strategy}})


def save(run, out: Path, name: str, result) -> None:
    inner = run.unwrap(result.model)
    torch.save({"state": {k: v.detach().clone() for k, v in inner.state_dict().items()},
                "losses": result.losses}, out / f"{name}-rank{run.rank}.pt")


def unused_parameter(run, out: Path) -> None:
    """A layer that forward never uses: the second step must name it."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.used(x)

    static, run.strategy = run.strategy, DDPStrategy(run.topology)  # torch's default: not static
    model = run.setup(Net())
    run.strategy = static
    message = "no error"
    try:
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
    except DistributedError as exc:
        message = str(exc)
    (out / f"unused-rank{run.rank}.txt").write_text(message)


def unwritable_checkpoint(run, out: Path) -> None:
    """A save rank 0 cannot make a directory for: every rank raises rank 0's message (no
    collective agrees on it first), then a save elsewhere works (the ranks kept in step)."""
    from phalanx.checkpoint.store import CheckpointError

    model = run.setup(nn.Linear(4, 2))
    if run.is_main:
        (out / "a-file").write_text("not a directory")
    run.barrier()
    try:
        run.save(out / "a-file" / "checkpoints", 1, model)
        message = "saved"
    except CheckpointError as exc:
        message = str(exc)
    after = run.save(out / "after-failure", 2, model)
    (out / f"unwritable-rank{run.rank}.txt").write_text(f"{message}\n{after.name}")


def log_scenario(run, out: Path) -> None:
    """`run.log` on 2 ranks: reduced over ranks, written by rank 0 only."""
    run.log_dir = out / "run-log"
    run.log(1, reduce="sum", x=float(run.rank + 1), y=torch.tensor(float(run.rank)))
    run.log(2, reduce="max", x=run.rank * 10)
    run.log(3, reduce=None, x=float(run.rank + 5))  # rank 0's own value, no collective
    run.end_log()
    run.log_dir = None


def main(out: Path, corpus: str, small_corpus: str, cache: str) -> None:
    splits = prepare(corpus, cache, 0.1)
    run = phalanx.init(seed=7, static_graph=build_config({}).dist.static_graph)  # as `train`
    with run:
        assert run.world_size == 2, run.world_size
        save(run, out, "ddp-b2-k1", train(config(2, 1, 3), run, splits))
        save(run, out, "ddp-b2-k2", train(config(2, 2, 3), run, splits))
        save(run, out, "ddp-long", train(config(4, 1, 40), run, splits))
        for micro, accum in ((4, 1), (2, 2)):
            torch.save(sgd_trajectory(run, splits.load("train"), micro, accum, steps=3),
                       out / f"sgd-b{micro}-k{accum}-rank{run.rank}.pt")
        unused_parameter(run, out)
        value = run.all_reduce_mean(float(run.rank + 1))
        (out / f"mean-rank{run.rank}.txt").write_text(repr(value))
        agreed = [run.agree(run.rank + 1, op) for op in ("max", "min", "sum")]
        agreed.append(run.agree(torch.tensor(run.rank == 0), "min"))
        (out / f"agree-rank{run.rank}.txt").write_text(repr(agreed))
        two_rank_scenarios(run, prepare(small_corpus, cache, 0.1), out)
        guard_scenarios(run, out)
        log_scenario(run, out)
        unwritable_checkpoint(run, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
