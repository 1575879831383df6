"""Loss curves from `metrics.jsonl`, written as a PNG next to it."""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable
from pathlib import Path

from phalanx.paths import atomic_write
from phalanx.report.charts import loss_label, new_figure
from phalanx.report.records import check_metric, read_records


def plot_losses(metrics_path: Path, out_path: Path, unit: str | None,
                warn: Callable[[str], None] | None = None) -> Path:
    """`phalanx train`'s loss plot, its y axis in `unit` (nats/token, or nats/byte with
    the bytes tokenizer; None: plain "loss"). Records the plot cannot
    use are skipped, said through `warn` when given (train's finish leaves that to the
    run report it builds next, so the warning comes once)."""
    records = read_records(Path(metrics_path), check_metric, warn or (lambda _: None))
    train, val = ([(r["step"], r[key]) for r in records if math.isfinite(r.get(key, math.nan))]
                  for key in ("loss", "val_loss"))
    try:
        png = _plot(train, val, unit)
    except (ValueError, OverflowError, FloatingPointError):  # values beyond drawing, ±1e308
        png = _plot([], [], unit)
    atomic_write(Path(out_path), png)  # never through a link planted there
    return out_path


def _plot(train: list, val: list, unit: str | None) -> bytes:
    fig = new_figure((7, 4))
    ax = fig.subplots()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow drawing e.g. 1e308
        if train:
            ax.plot(*zip(*train), label="train loss")
        if val:
            ax.plot(*zip(*val), "o-", label="validation loss")
        ax.set_xlabel("step")
        ax.set_ylabel(loss_label(unit))
        ax.grid(alpha=0.3)
        if train or val:
            ax.legend()
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=110)
        return png.getvalue()
