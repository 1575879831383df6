"""What the launcher says beside a rank the kernel killed (SIGKILL, most often its
out-of-memory killer): the plan's predicted peak per rank for this run's flags — MiniGPT's
formulas, every strategy, so the one that fits is named too — against what this machine
has for its ranks. Torch-free; computed only when a rank was killed."""

from __future__ import annotations

from phalanx.plan.devices import device
from phalanx.plan.recommend import plan


def predicted_peak_note(cfg, world: int) -> str:
    """`the plan predicts per rank at its peak: ddp 1.9 GiB, …; this machine: 23.0 GiB for
    2 ranks` (MiniGPT's formulas; '' for a user's model, which the plan traces instead)."""
    if cfg.model.factory is not None:
        return ("`phalanx plan --model` with this run's flags traces your model and "
                "predicts each rank's peak memory")
    found = plan(cfg, world, device(None), 0.4, None, None)
    peaks = ", ".join(f"{r['strategy']} {_gib(r['peak'])}" for r in found["rows"])
    return (f"the plan predicts per rank at its peak, for this run's flags: {peaks}; this "
            f"machine has {_gib(found['budget_bytes'] * world)} for its {world} rank(s) "
            f"(`phalanx plan` with the same flags shows how each part adds up)")


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
