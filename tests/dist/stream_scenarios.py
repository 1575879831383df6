"""Worker for tests/dist/test_stream_loader.py: `run.loader` over an IterableDataset that
shards itself, on 2 gloo ranks with uneven shares (rank 0: 7 items, rank 1: 5; batches of
2), trained under DDP; then saved after one batch and resumed from its own state.
Writes OUT/stream-rR.json. Usage: python stream_scenarios.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.utils.data import IterableDataset

import phalanx


class Share(IterableDataset):
    """This rank's items, from where it stands; its state: how many it handed out."""

    def __init__(self, items: list[int]) -> None:
        self.items, self.at = items, 0

    def __iter__(self):
        while self.at < len(self.items):
            self.at += 1
            yield self.items[self.at - 1]

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


def main(out: Path) -> None:
    with phalanx.init(seed=0, threads=1) as run:
        model = run.setup(torch.nn.Linear(1, 1))
        mine = list(range(run.rank, 14 if run.rank == 0 else 10, 2))
        even = []
        for batch in run.loader(Share(mine), 2):  # DDP's all-reduce in every backward
            model(batch.float().unsqueeze(1)).sum().backward()
            even.append(batch.tolist())
        uneven = [b.tolist() for b in run.loader(Share(mine), 2, even=False)]
        loader = run.loader(Share(mine), 2)
        batches = iter(loader)
        first = next(batches).tolist()
        run.save(out / "ckpt", 1, model, loader=loader)
        rest = [b.tolist() for b in batches]
        again = run.loader(Share(mine), 2)
        step = run.resume(out / "ckpt", model, loader=again)
        resumed = [b.tolist() for b in again]
        (out / f"stream-r{run.rank}.json").write_text(json.dumps({
            "even": even, "uneven": uneven, "first": first, "rest": rest, "step": step,
            "resumed": resumed}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
