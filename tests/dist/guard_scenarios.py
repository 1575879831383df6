"""Runtime guards on 2 ranks: a replica changed after construction is named, devices are
diagnosed. Called from scenarios.main in the shared process group."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from phalanx.errors import DistributedError


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(4, 8), nn.Linear(8, 2)
        self.register_buffer("scale", torch.ones(2))

    def forward(self, x):
        return self.head(self.embed(x)) * self.scale


def _check(run, model) -> str:
    try:
        run.check_consistency(model)
    except DistributedError as exc:
        return str(exc)
    return "consistent"


def guard_scenarios(run, out: Path) -> None:
    torch.manual_seed(100 + run.rank)  # different init per rank: DDP's broadcast fixes it
    model = run.setup(Net())
    results = {"fresh": _check(run, model)}
    model(torch.randn(3, 4)).sum().backward()
    results["after a step"] = _check(run, model)
    if run.rank == 1:  # one replica changed outside the synchronised step
        with torch.no_grad():
            run.unwrap(model).head.weight[0, 0] += 1e-3
    results["perturbed"] = _check(run, model)
    batch = (torch.randn(2, 4), {"mask": torch.ones(2, device="meta")})
    results["devices"] = "\n".join(run.diagnose_devices(model, batch))
    torch.save(results, out / f"guards-rank{run.rank}.pt")
