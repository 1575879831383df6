"""Worker for the sharded-strategy tests (tests/dist/test_sharded.py): launched at 2 ranks
(equivalence runs, then the resume matrix's first halves and resumes) and at 3 ranks
(resumes only). The strategy of each run is swapped in on the same process group.

Every run saves, from rank 0, the gathered full weights, the losses and the gradient
norms before clipping to OUT/<name>.pt.
Usage: python sharded_scenarios.py OUT CORPUS CACHE {equivalence,matrix,resume}
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

import phalanx
from phalanx.config.sections import build_config
from phalanx.data.corpus import prepare
from phalanx.strategies import make_strategy
from phalanx.train.loop import train

TINY = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}
# (label, strategy, options): every way of splitting the same global batch
VARIANTS = {
    "ddp": ("ddp", {}),
    "zero": ("zero", {}),
    "fsdp": ("fsdp", {}),
    "fsdp-noreshard": ("fsdp", {"reshard_after_forward": False}),
    "fsdp-last": ("fsdp", {"grad_sync": "last"}),
}
MATRIX = ("ddp", "zero", "fsdp")
GLOBAL = 12  # the matrix's global batch: 2 ranks × 3 × 2, 3 ranks × 2 × 2, 1 rank × 3 × 4
CLIP = 0.05  # small enough that every step clips (the test checks)


def config(micro: int, accum: int, steps: int, out: Path | None = None, resume="never",
           strategy: str = "ddp", precision: str = "fp32", optimizer: str = "adamw"):
    return build_config({
        "model": TINY,
        "train": {"micro_batch_size": micro, "grad_accum": accum, "max_steps": steps,
                  "lr_decay_steps": 4, "warmup_steps": 1, "eval_every": 1000, "eval_batches": 1,
                  "lr": 3e-3, "min_lr": 3e-4, "seed": 7, "grad_clip": CLIP, "log_every": 1,
                  "checkpoint_every": 2, "keep_checkpoints": 3, "resume": resume,
                  "out": str(out or "unused"), "sample_tokens": 0, "precision": precision,
                  "optimizer": optimizer, "muon_lr": 0.05},
        "dist": {"strategy": strategy, "check_consistency_every": 1}})


def matrix_shape(world: int) -> tuple[int, int]:
    """(micro-batch, accumulation) giving the matrix's global batch at `world` ranks."""
    return {1: (3, 4), 2: (3, 2), 3: (2, 2)}[world]


@contextlib.contextmanager
def using(run, label: str):
    """Run with variant `label`'s strategy (a mesh is added for sharded ones)."""
    name, options = VARIANTS[label]
    topology = run.topology
    if topology.mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        topology = dataclasses.replace(topology, mesh=init_device_mesh(
            "cpu", (run.world_size,), mesh_dim_names=("dp",)))
    saved, run.strategy = run.strategy, make_strategy(name, topology, **options)
    try:
        yield
    finally:
        run.strategy = saved


def dump(run, result, path: Path) -> None:
    weights = run.full_state_dict(result.model)  # every rank: sharded weights are gathered
    if run.is_main:
        torch.save({"state": {k: v.detach().clone() for k, v in weights.items()},
                    "losses": result.losses,
                    "norms": [float(n) for n in result.grad_norms]}, path)
    run.barrier()


def equivalence(run, splits, out: Path) -> None:
    for label in VARIANTS:
        for accum in (1, 2):
            if label == "fsdp-last" and accum == 1:
                continue
            with using(run, label):
                result = train(config(4 // accum, accum, 3), run, splits)
                dump(run, result, out / f"eq-{label}-k{accum}.pt")
    for precision in ("bf16", "fp16"):  # FSDP's policy + sharded scaler vs DDP's autocast
        for label in ("ddp", "fsdp", "zero"):
            with using(run, label):
                result = train(config(2, 2, 3, precision=precision), run, splits)
                dump(run, result, out / f"mp-{label}-{precision}.pt")
    muon(run, splits, out)
    sharded_guard(run, out)


def muon(run, splits, out: Path) -> None:
    """Muon needs whole matrices: zero (whole parameters per rank) and fsdp (the update
    gathered) against ddp; and a resume mid-run from each strategy's checkpoint."""
    for label in MATRIX:
        for accum in (1, 2):
            with using(run, label):
                result = train(config(4 // accum, accum, 3, optimizer="muon"), run, splits)
                dump(run, result, out / f"muon-{label}-k{accum}.pt")
    for label in MATRIX:
        where = out / f"muon-{label}"
        with using(run, label):
            result = train(config(2, 2, 4, where, optimizer="muon"), run, splits, where)
            dump(run, result, out / f"muon-straight-{label}.pt")
            checkpoint = where / "checkpoints" / "step-00000002"
            again = out / f"muon-{label}-resumed"
            result = train(config(2, 2, 4, again, str(checkpoint), optimizer="muon"), run,
                           splits, again)
            dump(run, result, out / f"muon-resumed-{label}.pt")


def sharded_guard(run, out: Path) -> None:
    """`check_consistency` on sharded state: passes as trained, names a buffer one rank
    changed."""
    import torch.nn as nn

    from phalanx.errors import DistributedError

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x):
            return self.layers(x) * self.scale

    with using(run, "fsdp"):
        model = run.setup(Net())
        model(torch.randn(2, 4)).sum().backward()
        run.check_consistency(model)  # as set up: shards where they belong, buffers equal
        if run.rank == 1:
            model.scale.add_(1.0)
        try:
            run.check_consistency(model)
            message = "no error"
        except DistributedError as exc:
            message = str(exc)
    (out / f"sharded-guard-rank{run.rank}.txt").write_text(message)


def matrix(run, splits, out: Path) -> None:
    """First halves (4 steps, checkpoints at 2 and 4), then every resume at this world."""
    micro, accum = matrix_shape(run.world_size)
    for first in MATRIX:
        with using(run, first):
            result = train(config(micro, accum, 4, out / first), run, splits, out / first)
            dump(run, result, out / f"straight-{first}.pt")
    resume(run, splits, out)


def resume(run, splits, out: Path) -> None:
    micro, accum = matrix_shape(run.world_size)
    for first in MATRIX:
        for then in MATRIX:
            where = out / f"{first}-to-{then}-w{run.world_size}"
            checkpoint = out / first / "checkpoints" / "step-00000002"
            with using(run, then):
                result = train(config(micro, accum, 4, where, str(checkpoint)), run, splits,
                               where)
                dump(run, result, out / f"resumed-{first}-{then}-w{run.world_size}.pt")


def main(out: Path, corpus: str, cache: str, what: str) -> None:
    splits = prepare(corpus, cache, 0.1)
    with phalanx.init(seed=7) as run:
        {"equivalence": equivalence, "matrix": matrix, "resume": resume}[what](run, splits, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
