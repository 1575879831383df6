"""Worker for tests/dist/test_user_loader.py: torchdata's StatefulDataLoader (2 worker
processes, a shuffling DistributedSampler: each rank its own share) saved with
`run.save(loader=...)` mid-epoch and resumed in a new launch.

`straight`: 6 batches, a checkpoint after the 3rd; every batch goes to OUT/straight-rR.json.
`resumed`: `run.resume(loader=...)` then 3 batches to OUT/resumed-rR.json; or (at another
world size) the error's text to OUT/refused-rR.txt.
Usage: python user_loader_scenarios.py OUT {straight,resumed}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

import phalanx
from phalanx.errors import UserError


def loader(run) -> StatefulDataLoader:
    data = list(range(96))
    sampler = DistributedSampler(data, num_replicas=run.world_size, rank=run.rank, seed=3)
    return StatefulDataLoader(data, batch_size=4, sampler=sampler, num_workers=2)


def main(out: Path, what: str) -> None:
    with phalanx.init(seed=0, threads=1) as run:
        model = run.setup(torch.nn.Linear(2, 2))
        data = loader(run)
        if what == "straight":
            batches, it = [], iter(data)
            for i in range(6):
                batches.append(next(it).tolist())
                if i == 2:
                    run.save(out / "ckpt", 3, model, loader=data)
            (out / f"straight-r{run.rank}.json").write_text(json.dumps(batches))
            return
        try:
            step = run.resume(out / "ckpt", model, loader=data)
        except UserError as exc:
            (out / f"refused-r{run.rank}.txt").write_text(str(exc))
            return
        it = iter(data)
        batches = [next(it).tolist() for _ in range(3)]
        (out / f"resumed-r{run.rank}.json").write_text(json.dumps({"step": step,
                                                                   "batches": batches}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
