"""Worker for tests/dist/test_pipeline_train.py: the built-in trainer (`train`, the loop
`phalanx train` runs) under pipeline stages on 4 gloo ranks, one process group, each
case's mesh built for it:

- pp 2 × dp_shard 2 under 1F1B and pp 2 × tp 2 under GPipe: 3 AdamW steps of one global
  batch (8 sequences: 2 micro-batches of the accumulation window through the schedule),
  evaluated at step 3 (the schedule's forward-only `eval`), checkpointed at step 2;
- dp_shard 4 (no pipeline): the same steps, the bound the test derives its tolerance from;
- the pp 2 × dp_shard 2 run's step-2 checkpoint resumed under dp_shard 4 to step 3.
OUT/<case>.pt: the whole weights (rank 0), losses, norms, val losses, step, data position.
Usage: python pipeline_train_scenarios.py OUT CORPUS CACHE
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from pipeline_scenarios import laid_out
from sharded_scenarios import CLIP, TINY

import phalanx
from phalanx.config.sections import build_config
from phalanx.data.corpus import prepare
from phalanx.train.loop import train

GLOBAL, ACCUM, STEPS = 8, 2, 3
CASES = {  # name: phalanx.init's layout keywords, schedule
    "pp-dp-1f1b": ({"pp": 2, "dp_shard": 2}, "1f1b"),
    "pp-tp-gpipe": ({"pp": 2, "tp": 2}, "gpipe"),
    "dp4": ({"dp_shard": 4}, "1f1b"),
}


def config(micro: int, accum: int, steps: int = STEPS, out: Path | None = None,
           resume: str = "never", schedule: str = "1f1b"):
    """The trainer's config (the layout is the run's, set by `laid_out`); the validation
    loss at the last step over micro × data-parallel ranks = 4 sequences in every case."""
    return build_config({
        "model": {**TINY, "n_layer": 4},
        "train": {"micro_batch_size": micro, "grad_accum": accum, "max_steps": steps,
                  "lr_decay_steps": 4, "warmup_steps": 1, "eval_every": STEPS,
                  "eval_batches": 1, "lr": 3e-3, "min_lr": 3e-4, "seed": 7,
                  "grad_clip": CLIP, "log_every": 1, "checkpoint_every": 2,
                  "keep_checkpoints": 3, "resume": resume, "out": str(out or "unused"),
                  "sample_tokens": 0, "optimizer": "adamw"},
        "dist": {"pp_schedule": schedule}})


def dump(run, result, path: Path) -> None:
    weights = run.full_state_dict(result.model)
    if run.is_main:
        torch.save({"state": {k: v.detach().clone() for k, v in weights.items()},
                    "losses": result.losses, "val": result.val_losses,
                    "norms": [float(n) for n in result.grad_norms],
                    "step": result.state.step, "position": result.state.position}, path)
    run.barrier()


def main(out: Path, corpus: str, cache: str) -> None:
    splits = prepare(corpus, cache, 0.1)
    with phalanx.init(seed=7, threads=1) as run:
        for name, (dims, schedule) in CASES.items():
            with laid_out(run, **dims):
                micro = GLOBAL // (ACCUM * run.topology.dp_size)
                where = out / name
                dump(run, train(config(micro, ACCUM, out=where, schedule=schedule), run,
                                splits, where), out / f"{name}.pt")
        checkpoint = out / "pp-dp-1f1b" / "checkpoints" / "step-00000002"
        with laid_out(run, dp_shard=4):
            where = out / "resumed-dp4"
            dump(run, train(config(1, ACCUM, out=where, resume=str(checkpoint)), run, splits,
                            where), out / "resumed-dp4.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
