"""The run report's charts: small matplotlib figures written as inline SVG (text as paths,
so the page needs no font and no network)."""

from __future__ import annotations

import io
import math
import warnings
from typing import Any

# (title, y label, [(metrics key, legend label, style)]); the loss's label is the run's
# unit when it has one (loss_label)
CHARTS = [
    ("Loss", "loss", [("loss", "train", "-"), ("val_loss", "validation", "o-")]),
    ("Validation loss per byte", "nats/byte (compares tokenizers)",
     [("val_nats_per_byte", "validation", "o-")]),
    ("Learning rate", "lr", [("lr", "lr", "-")]),
    ("Throughput", "tokens/s", [("tokens_per_s", "tokens/s", "-")]),
    ("Step time", "seconds per step", [("step_time_s", "step time", "-")]),
    ("Gradient norm", "global norm, before clipping", [("grad_norm", "grad norm", "-")]),
    ("Rank pace", "slowest rank's own time ÷ fastest's",
     [("slowest_to_fastest", "slowest ÷ fastest", "-")]),
    ("Peak memory (rank 0)", "MiB", [("memory_mib", "peak", "-")]),
]

EVENT_COLOURS = {"restart": "#d62728", "nan": "#ff7f0e", "rollback": "#9467bd",
                 "spike": "#bcbd22", "straggler": "#17becf", "failure": "#8c564b",
                 "stop": "#7f7f7f"}  # (a run's start and end are not marked)


def loss_label(unit: str | None) -> str:
    """The loss chart's y label: cross-entropy in the run's unit, or plain "loss"."""
    return f"cross-entropy ({unit})" if unit else "loss"


def _same_as_val_loss(records: list[dict[str, Any]]) -> bool:
    return all(r.get("val_nats_per_byte") == r.get("val_loss") for r in records
               if "val_nats_per_byte" in r)


def charts_svg(records: list[dict[str, Any]], events: list[dict[str, Any]],
               loss_unit: str | None = None) -> list[tuple[str, str]]:
    """(what it shows, SVG) per chart that has data; events are marked on the loss chart.
    `records` are checked ones (report.records): an int `step`, float figures; points
    that are not finite are left out. A chart matplotlib cannot draw (values spanning
    more than a float, e.g. ±1e308) is a line of text in its place."""
    import matplotlib

    out = []
    with matplotlib.rc_context({"svg.fonttype": "path", "font.size": 9}), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow drawing e.g. 1e308
        for title, ylabel, series in CHARTS:
            if series[0][0] == "val_nats_per_byte" and _same_as_val_loss(records):
                continue  # bytes: a token is a byte, the loss chart says it already
            ylabel = loss_label(loss_unit) if title == "Loss" else ylabel
            points = [(label, style, [(r["step"], r[key]) for r in records
                                      if _drawable(r.get(key))])
                      for key, label, style in series]
            if not any(p for *_, p in points):
                continue
            try:
                svg = _chart(title, ylabel, points, events if title == "Loss" else [])
            except (ValueError, OverflowError, FloatingPointError):
                svg = (f'<p class="none">{title}: the values span more than the chart can '
                       "draw.</p>")
            out.append((f"{title}: {ylabel} by step", svg))
    return out


def _chart(title: str, ylabel: str, points: list[tuple[str, str, list]],
           events: list[dict[str, Any]]) -> str:
    """One chart of `points` ([(legend label, style, [(step, value)])]) as SVG."""
    fig = new_figure((5.4, 3.0))
    ax = fig.subplots()
    for label, style, p in points:
        if p:
            ax.plot(*zip(*p), style, label=label, markersize=3, linewidth=1.4)
    _mark_events(ax, events)
    ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len([p for *_, p in points if p]) > 1 or title == "Loss":
        ax.legend(fontsize=8, frameon=False)
    # fixed margins that fit the longest label and tick text (tight_layout measured every
    # text first: 0.1 s per chart)
    fig.subplots_adjust(left=0.15, right=0.98, bottom=0.16, top=0.89)
    return _svg(fig)


def new_figure(size: tuple[float, float]):
    """A matplotlib Figure outside pyplot (no global figure registry, no GUI backend, and
    0.7 s less to import): drawn with Agg, freed when it goes out of scope."""
    from matplotlib.figure import Figure

    return Figure(figsize=size)


def _drawable(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def _mark_events(ax, events: list[dict[str, Any]]) -> None:
    seen = set()
    for e in events:
        kind = e.get("kind")
        if kind not in EVENT_COLOURS or not isinstance(e.get("step"), int):
            continue
        ax.axvline(e["step"], color=EVENT_COLOURS[kind], linestyle=":", linewidth=1.2,
                   label=kind if kind not in seen else None)
        seen.add(kind)


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg"):]  # no XML prolog inside HTML
