"""`phalanx bench --defaults`: each of Phalanx's performance defaults against torch's.

Every variant is Phalanx's own step with exactly one setting put back to what torch
(DDP, AdamW) does when it is not told otherwise; all variants are timed in the same
alternating rounds as Phalanx's step, so `Phalanx / variant` is the effect of that one
default on this machine, model and world size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.bench.peers import phalanx


@dataclass(frozen=True)
class Variant:
    setting: str  # what differs, e.g. "DDP static_graph"
    ours: str  # Phalanx's value here
    torch: str  # torch's default
    ddp: dict = field(default_factory=dict)  # strategy options for the variant (any strategy)
    fused: bool | None = None  # AdamW for the variant

    @property
    def label(self) -> str:
        return f"torch's {self.setting}"


def variants(run) -> list[Variant]:
    """The defaults Phalanx sets differently from torch, for this run's strategy (its
    `alternatives`) and device."""
    found = [Variant(a.setting, a.ours, a.theirs, a.options)
             for a in run.strategy.alternatives()]
    if run.device.type in ("cpu", "cuda"):
        loop = "for-loop" if run.device.type == "cpu" else "foreach"
        found.append(Variant("AdamW implementation", "fused", loop, fused=False))
    return found


def setups(cfg, tokens, run) -> dict:
    """{label: step} for every variant, built like `peers.phalanx`."""
    built = {}
    for v in variants(run):
        built[v.label] = phalanx(cfg, tokens, run, ddp=v.ddp, fused=v.fused)
        built[v.label].variant = v
    return built


def describe(steps: dict) -> list[dict]:
    """What results.json records about each variant (its times are under `peers`)."""
    return [{"label": label, "setting": s.variant.setting, "ours": s.variant.ours,
             "torch": s.variant.torch} for label, s in steps.items()]
