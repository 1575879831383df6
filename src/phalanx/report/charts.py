"""The run report's charts: small matplotlib figures written as inline SVG (text as paths,
so the page needs no font and no network)."""

from __future__ import annotations

import io
from typing import Any

# (title, y label, [(metrics key, legend label, style)])
CHARTS = [
    ("Loss", "cross-entropy (nats/byte)",
     [("loss", "train", "-"), ("val_loss", "validation", "o-")]),
    ("Learning rate", "lr", [("lr", "lr", "-")]),
    ("Throughput", "tokens/s", [("tokens_per_s", "tokens/s", "-")]),
    ("Step time", "seconds per step", [("step_time_s", "step time", "-")]),
    ("Gradient norm", "global norm, before clipping", [("grad_norm", "grad norm", "-")]),
    ("Peak memory (rank 0)", "MiB", [("memory_mib", "peak", "-")]),
]

EVENT_COLOURS = {"restart": "#d62728", "nan": "#ff7f0e", "rollback": "#9467bd",
                 "spike": "#bcbd22", "straggler": "#17becf"}


def charts_svg(records: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[str]:
    """One SVG per chart that has data; events are marked on the loss chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    with matplotlib.rc_context({"svg.fonttype": "path", "font.size": 9}):
        for title, ylabel, series in CHARTS:
            points = [(key, label, style, [(r["step"], r[key]) for r in records
                                           if isinstance(r.get(key), (int, float))])
                      for key, label, style in series]
            if not any(p for *_, p in points):
                continue
            fig, ax = plt.subplots(figsize=(5.4, 3.0))
            for _, label, style, p in points:
                if p:
                    ax.plot(*zip(*p), style, label=label, markersize=3, linewidth=1.4)
            if title == "Loss":
                _mark_events(ax, events)
            ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if len([p for *_, p in points if p]) > 1 or title == "Loss":
                ax.legend(fontsize=8, frameon=False)
            fig.tight_layout()
            out.append(_svg(fig))
            plt.close(fig)
    return out


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
