"""`phalanx bench --defaults`: each of Phalanx's performance defaults against torch's.

Every variant is Phalanx's own step with exactly one setting put back to what torch
(DDP, AdamW) does when it is not told otherwise; all variants are timed in the same
alternating rounds as Phalanx's step, so `Phalanx / variant` is the effect of that one
default on this machine, model and world size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.bench.peers import phalanx
from phalanx.config.strategy import DDPOptions, FSDPOptions


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
    """The defaults Phalanx sets differently from torch, for this run's strategy/device."""
    found = []
    opts = run.strategy.options
    if isinstance(opts, DDPOptions):  # ddp and zero
        if opts.static_graph:
            found.append(Variant("DDP static_graph", "True", "False", {"static_graph": False}))
        if opts.gradient_as_bucket_view:
            found.append(Variant("DDP gradient_as_bucket_view", "True", "False",
                                 {"gradient_as_bucket_view": False}))
        cap = opts.bucket_cap_mb
        found.append(Variant("DDP bucket sizes", f"{cap:g} MiB, every bucket",
                             "25 MiB, the first 1 MiB", {"bucket_cap_mb": None}))
    if isinstance(opts, FSDPOptions):
        # not torch defaults (torch's are ours here): the alternatives users choose between
        other = "last" if opts.grad_sync == "every" else "every"
        found.append(Variant("FSDP gradient sync under accumulation", opts.grad_sync,
                             f"{other} (alternative)", {"grad_sync": other}))
        found.append(Variant("FSDP reshard_after_forward", str(opts.reshard_after_forward),
                             f"{not opts.reshard_after_forward} (alternative)",
                             {"reshard_after_forward": not opts.reshard_after_forward}))
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
