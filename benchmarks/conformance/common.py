"""The one task every library's conformance script trains, the one command line they all
take, and the one record they all write (benchmarks/conformance, issue 46; the matrix:
docs/conformance.md).

Each library's script (`<library>_script.py`) is written the way that library's docs say
to save and resume; only the task, the arguments and the record below are shared, so the
cells compare libraries, not scripts.

The task: `N_SAMPLES` samples whose features and target are derived from the sample's
index alone (so every library sees the same data and the record can say which sample a
step used), a small MLP with dropout, mean squared error.

The record (`Trace`): one JSON line per optimizer step and rank in
`OUT/trace-rank{R}.jsonl`, flushed at once (a killed process keeps what it wrote):
`{"life": L, "step": S, "rank": R, "samples": [...], "loss": x}` — `step` is the
library's own optimizer-step counter after the step (1 for the first), `samples` the
dataset indices this rank used in that step (all micro-batches), `loss` this rank's mean
micro-batch loss. Rank 0 writes the final weights to `OUT/final.pt` at the end.

A run is killed (`--kill-after-step K`): every rank finishes optimizer step K, runs one
more micro-batch forward and backward (mid-window under accumulation), then kills itself
with SIGKILL — as a preempted or crashed job ends, with no chance to save.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

N_SAMPLES, N_FEATURES = 96, 8


class IndexedData(Dataset):
    """Sample i: (i, x_i, y_i), x_i and y_i drawn from a generator seeded with i."""

    def __init__(self, n: int = N_SAMPLES) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(1000 + int(i))
        x = torch.randn(N_FEATURES, generator=g)
        y = x.sum().reshape(1) * 0.5 + 0.1 * torch.randn(1, generator=g)
        return torch.tensor(int(i)), x, y


def make_model(dropout: float) -> nn.Module:
    """The same initial weights everywhere (seeded here, not by the caller)."""
    g = torch.random.fork_rng()
    with g:
        torch.manual_seed(1234)
        return nn.Sequential(nn.Linear(N_FEATURES, 32), nn.ReLU(), nn.Dropout(dropout),
                             nn.Linear(32, 1))


def loss_fn(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(prediction, target)


def parser(library: str) -> argparse.ArgumentParser:
    """The arguments every script takes (a script may refuse a combination its library
    cannot do: it then exits 3 with one line on stderr, 'refused: ...')."""
    p = argparse.ArgumentParser(description=f"conformance script: {library}")
    p.add_argument("--out", required=True, help="run directory: checkpoints and the record")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4, help="samples per rank per micro-batch")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0, help="shuffle and dropout seed")
    p.add_argument("--no-shuffle", action="store_true")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--scheduler", action="store_true", help="StepLR(step_size=3, gamma=0.7)")
    p.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="save a checkpoint every N optimizer steps (0: never)")
    p.add_argument("--kill-after-step", type=int, default=0,
                   help="SIGKILL every rank after optimizer step K + one micro-batch")
    p.add_argument("--resume", action="store_true",
                   help="resume from the latest checkpoint in --out")
    p.add_argument("--life", type=int, default=0, help="which life of the run (recorded)")
    return p


class Trace:
    """This rank's record of its optimizer steps (see the module's docstring)."""

    def __init__(self, out: str | Path, rank: int, life: int) -> None:
        self.path = Path(out) / f"trace-rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank, self.life = rank, life
        self.samples: list[int] = []
        self.losses: list[float] = []

    def micro(self, indices: torch.Tensor, loss: torch.Tensor) -> None:
        """One micro-batch: its dataset indices and its loss."""
        self.samples += [int(i) for i in indices.reshape(-1).tolist()]
        self.losses.append(float(loss.detach()))

    def step(self, step: int) -> None:
        """An optimizer step ended; `step`: the library's own counter after it."""
        line = {"life": self.life, "step": int(step), "rank": self.rank,
                "samples": self.samples,
                "loss": sum(self.losses) / max(len(self.losses), 1)}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.samples, self.losses = [], []


def kill_now() -> None:
    """As a preempted job ends: no handler runs, nothing is saved."""
    os.kill(os.getpid(), signal.SIGKILL)


def save_final(out: str | Path, state_dict: dict) -> None:
    """Rank 0: the final weights, as plain CPU tensors, in `OUT/final.pt`."""
    torch.save({k: v.detach().cpu().clone() for k, v in state_dict.items()},
               Path(out) / "final.pt")


def latest_or_fresh(candidates: list[Path], step_of, library: str, where: Path) -> Path | None:
    """The candidate checkpoint with the largest step (`step_of(path)`); None, said on
    stderr, when there is none (the run then starts fresh, as the libraries' examples do)."""
    import sys

    found = max(candidates, key=step_of, default=None)
    if found is None:
        print(f"[{library}] --resume: no checkpoint in {where}, starting fresh", file=sys.stderr)
    return found


def refuse(why: str) -> None:
    """The library cannot do what the scenario asks: exit 3 with one line."""
    import sys

    print(f"refused: {why}", file=sys.stderr)
    raise SystemExit(3)
