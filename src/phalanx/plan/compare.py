"""`--measure`: the planned variants run on W local ranks (phalanx.plan.measure) and each
prediction set beside its measurement.

torch's memory tracker files memory by kind; the plan's components map onto them as
parameters → parameters, gradients → gradients (DDP's buckets included), optimizer →
optimizer state, and activations + communication → activations and temporaries (the
tracker files a collective's buffers with the step's temporaries).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from phalanx.launch.agent import launch_workers, threads_per_rank
from phalanx.plan.estimate import VARIANTS, Variant

COMPARED = {"parameters": ("parameters",), "gradients": ("gradients",),
            "optimizer": ("optimizer",), "activations": ("activations", "communication"),
            "peak": ("peak",)}


def measure_locally(cfg, W: int, steps: int, rows: list[dict],
                    extra: tuple[Variant, ...] = ()) -> dict:
    """{variant: {component: {"predicted", "measured", "ratio"}, "step_s": …}}; `extra`:
    variants beside the 1-D ones (an HSDP layout), each measured on its own mesh."""

    with tempfile.TemporaryDirectory(prefix="phalanx-plan-") as tmp:
        spec = {"config": cfg.to_dict(), "steps": steps,
                "variants": [[v.label, v.strategy, v.reshard, v.layout]
                             for v in VARIANTS + tuple(extra)],
                "result": os.path.join(tmp, "measured.json")}
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(spec))
        launch_workers(["-m", "phalanx.plan.measure", str(path)], W,
                       threads=threads_per_rank(W, cfg.dist.threads_per_rank))
        measured = json.loads(Path(spec["result"]).read_text())
    return {row["strategy"]: compare(row, measured[row["strategy"]]) for row in rows}


PEAK_BAND, COMPONENT_BAND, NEGLIGIBLE = (0.9, 1.1), (0.85, 1.15), 0.05


def compare(predicted: dict, measured: dict) -> dict:
    """Each compared quantity's prediction, measurement and ratio, and whether it is
    within its band: the peak 0.9–1.1, a component 0.85–1.15 — or, for a component,
    both under 5% of the measured peak (a ratio of near-zeros says nothing)."""
    out = {}
    for name, parts in COMPARED.items():
        p = sum(predicted[k] for k in parts)
        m = measured[name]
        low, high = PEAK_BAND if name == "peak" else COMPONENT_BAND
        small = name != "peak" and max(p, m) < NEGLIGIBLE * measured["peak"]
        out[name] = {"predicted": p, "measured": m, "ratio": p / m if m else None,
                     "within": small or (m > 0 and low <= p / m <= high)}
    out["step_s"] = measured["step_s"]
    out["rank"] = measured["rank"]
    return out
