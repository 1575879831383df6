"""Worker for tests/dist/test_own_script.py: a user's own loop on the public API, 2 gloo
ranks in one process group. Each scenario writes OUT/<name>-rank<r>.pt.

The loop is the README's: `run.resume` → epochs of `run.loader` → `acc.micro_step()` /
`acc.backward` → `run.clip_grad_norm_` → `run.step` → `run.save(..., loader=loader)`.
Usage: python own_script_scenarios.py OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset

import phalanx

SAMPLES, BATCH, ACCUM, STEPS = 44, 4, 2, 9  # 5 global batches an epoch: windows straddle epochs
# fp16's loss scaler (torch's default: 2**16, ×2 after 2,000 steps without overflow):
# step 1's gradient is made infinite (INF_AT: halved), steps 2, 3 are not (×4), so the
# scale at the commit (step 3) is 2**11 — neither this start nor torch's default
SCALER = {"scale": 2.0 ** 10, "growth_factor": 4.0, "backoff_factor": 0.5,
          "growth_interval": 2, "_growth_tracker": 0}
INF_AT = 1


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 6, generator=g)
    return TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def fresh(run, precision: str = "fp32", batch: int = BATCH, dropout: float = 0.1):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.Dropout(dropout), nn.GELU(), nn.Linear(16, 1))
    model, opt = run.setup(net, lambda p: torch.optim.AdamW(p, lr=1e-2), precision=precision)
    if run.precision.scaler is not None:  # the scale falls and grows before the commit:
        run.precision.scaler.load_state_dict(SCALER)  # a resume must restore it
    return model, opt, run.loader(data(), batch), run.accumulate(model, ACCUM)


def train(run, parts, ckpt: Path, stop_at: int, save_every: int = 3,
          scales: list[float] | None = None) -> list[float]:
    """The README's loop, from wherever `run.resume` puts it, until `stop_at` steps.
    `scales` (fp16): the loss scale before the first step and after each, step INF_AT's
    loss made infinite (an overflow, as a bad batch gives: the scaler skips the step)."""
    model, opt, loader, acc = parts
    step = run.resume(ckpt, model, opt, loader=loader)
    losses: list[float] = []
    scaler = run.precision.scaler
    if scales is not None and scaler is not None:
        scales.append(scaler.get_scale())
    while step < stop_at:
        for x, y in loader:
            with acc.micro_step():  # seeded: dropout replays exactly on resume
                loss = nn.functional.mse_loss(model(x), y)
                if scales is not None and scaler is not None and step + 1 == INF_AT:
                    loss = loss * float("inf")
                acc.backward(loss)
            if acc.boundary:
                run.clip_grad_norm_(model, 0.5)
                run.step(opt)
                step += 1
                losses.append(run.log(step, loss=loss)["loss"])
                if scales is not None and scaler is not None:
                    scales.append(scaler.get_scale())
                if step % save_every == 0:
                    run.save(ckpt, step, model, opt, loader=loader)
                if step == stop_at:
                    break
    return losses


def weights(run, model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().float() for k, v in run.unwrap(model).state_dict().items()}


def resume_scenario(run, out: Path, precision: str) -> None:
    whole = fresh(run, precision)
    scales: list[float] = []
    losses = train(run, whole, out / f"whole-{precision}", STEPS, scales=scales)
    first = fresh(run, precision)  # committed at step 3; 4, 5 are lost
    train(run, first, out / f"cut-{precision}", 5, scales=[])
    again = fresh(run, precision)
    resumed = train(run, again, out / f"cut-{precision}", STEPS, scales=[])
    scaler = run.precision.scaler
    torch.save({"whole": weights(run, whole[0]), "resumed": weights(run, again[0]),
                "losses": losses, "resumed_losses": resumed,
                "scale": None if scaler is None else scaler.get_scale(), "scales": scales,
                "position": again[2].position},
               out / f"resume-{precision}-rank{run.rank}.pt")


def across_world_sizes(run, out: Path) -> None:
    """No dropout (its masks are per rank): the test process resumes `half` at world size
    1 with twice the batch and compares with `whole`."""
    whole = fresh(run, dropout=0.0)
    train(run, whole, out / "nodrop-whole", STEPS)
    train(run, fresh(run, dropout=0.0), out / "nodrop-half", 6)
    torch.save(weights(run, whole[0]), out / f"nodrop-rank{run.rank}.pt")


def log_scenario(run, out: Path) -> None:
    record = run.log(1, reduce="sum", value=float(run.rank + 1))
    mean = run.log(2, value=torch.tensor(float(run.rank)))
    torch.save({"sum": record, "mean": mean}, out / f"log-rank{run.rank}.pt")


def main(out: Path) -> None:
    run = phalanx.init(seed=4, threads=1, log_dir=out / "logs")
    with run:
        for precision in ("fp32", "bf16", "fp16"):
            resume_scenario(run, out, precision)
        across_world_sizes(run, out)
        log_scenario(run, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
