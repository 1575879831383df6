"""Resume scenarios, run inside a multi-rank worker (scenarios.py, resume_worker.py) and
in the test process (world size 1).

A tiny corpus (56 training windows) makes an epoch last 7 steps at 2 ranks × 2 × 2, so
the stop at step 8 falls mid-epoch, after the first reshuffle. Every training sample a
rank reads is recorded (`train(..., samples=)`), so tests can account for each one.
"""

from __future__ import annotations

import json

import shutil
import sys
from pathlib import Path

import torch

from phalanx.config.sections import build_config
from phalanx.data.corpus import TokenSplits
from phalanx.strategies.ddp import DDPStrategy
from phalanx.config.strategy import DDPOptions
from phalanx.train.worker import strategy_options
from phalanx.train.loop import train

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "dropout": 0.1}
STEPS, HALF = 16, 8


def resume_config(out: Path, steps: int, resume: str = "auto"):
    return build_config({
        "model": TINY,
        "train": {"micro_batch_size": 2, "grad_accum": 2, "max_steps": steps,
                  "lr_decay_steps": STEPS, "warmup_steps": 2, "eval_every": 1000,
                  "eval_batches": 1, "lr": 3e-3, "min_lr": 3e-4, "seed": 7, "log_every": 1,
                  "checkpoint_every": 0, "resume": resume, "out": str(out),
                  "sample_tokens": 0}})


def train_recorded(run, splits: TokenSplits, out: Path, steps: int, resume: str = "auto"):
    ids: list[int] = []
    result = train(resume_config(out, steps, resume), run, splits, out, samples=ids)
    return result, ids


def dump(run, result, ids: list[int], path: Path) -> None:
    inner = run.unwrap(result.model)
    torch.save({"state": {k: v.detach().clone() for k, v in inner.state_dict().items()},
                "losses": result.losses, "ids": ids, "step": result.state.step,
                "position": result.state.position}, path)


def two_rank_scenarios(run, splits: TokenSplits, out: Path) -> None:
    """Straight 16 steps; 8 steps then resume to 16 (the 8-step checkpoint is kept)."""
    r, static = run.rank, run.strategy
    run.strategy = DDPStrategy(run.topology, DDPOptions(
        **strategy_options(resume_config(out, STEPS), run.world_size)))
    result, ids = train_recorded(run, splits, out / "straight", STEPS)
    dump(run, result, ids, out / f"straight-rank{r}.pt")
    if run.is_main:  # of the last save: what rank 0 had to read back to checksum
        (out / "last-save.json").write_text(json.dumps(run.checkpoint_timings))
    result, ids = train_recorded(run, splits, out / "halves", HALF)
    dump(run, result, ids, out / f"first-half-rank{r}.pt")
    run.barrier()
    if run.is_main:  # a copy: the resumed run's checkpoints must not replace it
        shutil.copytree(out / "halves" / "checkpoints", out / "at-half")
    run.barrier()
    result, ids = train_recorded(run, splits, out / "halves", STEPS)
    dump(run, result, ids, out / f"second-half-rank{r}.pt")
    run.strategy = static


def main(out: Path, corpus: str, cache: str) -> None:
    """Launched at 3 ranks: resume the 2-rank checkpoint of step 8 and finish."""
    import phalanx
    from phalanx.data.corpus import prepare

    splits = prepare(corpus, cache, 0.1)
    with phalanx.init(seed=7) as run:
        result, ids = train_recorded(run, splits, out / f"resumed-{run.world_size}",
                                     STEPS, resume=str(out / "at-half"))
        dump(run, result, ids, out / f"resumed-{run.world_size}-rank{run.rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
