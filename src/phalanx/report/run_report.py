"""`OUT/report.html`: one self-contained page per run (no script, no network) — a summary,
charts of loss, validation loss, learning rate, throughput, step time, gradient norm and
memory, the run's events (restarts, NaN-guard skips, spikes, slow ranks), its
checkpoints, its configuration and environment. Written at the end of `phalanx train`;
`phalanx report RUN_DIR` rebuilds it from the files, e.g. after a failed run."""

from __future__ import annotations

import html
import json
import os
import statistics
from pathlib import Path
from typing import Any

from phalanx.report.charts import charts_svg
from phalanx.report.events import read_events
from phalanx.report.metrics import read_metrics

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;
background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 10px}
.sub{color:#5b6475;margin-bottom:18px}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{background:#fff;border:1px solid #e2e5ea;border-radius:8px;padding:10px 14px;
min-width:140px}
.card b{display:block;font-size:18px}.card span{color:#5b6475;font-size:12px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:12px}
.chart{background:#fff;border:1px solid #e2e5ea;border-radius:8px;padding:6px}
.chart svg{width:100%;height:auto}
table{border-collapse:collapse;background:#fff;border:1px solid #e2e5ea;width:100%}
td,th{padding:5px 10px;border-bottom:1px solid #eef0f3;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
.kind{font-weight:600}.none{color:#5b6475}td.when{white-space:nowrap;color:#5b6475}
.sections{columns:3 340px;column-gap:12px}.sections>div{break-inside:avoid;margin-bottom:12px}
"""


def build_report(run_dir: Path, out_path: Path | None = None) -> Path:
    """Write the report of the run in `run_dir` (default: `run_dir/report.html`)."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / "metrics.jsonl"
    records = read_metrics(metrics_path) if metrics_path.is_file() else []
    config = _json(run_dir / "run_config.json")
    events = read_events(run_dir)
    body = [f"<h1>Phalanx run: {_e(run_dir.resolve().name)}</h1>",
            f'<div class="sub">{_e(str(run_dir.resolve()))}</div>',
            _summary(records, config, _json(run_dir / "environment.json"),
                     "complete" if (run_dir / "model.safetensors").is_file() else
                     "not finished"),
            "<h2>Charts</h2>", _charts(records, events),
            "<h2>Events</h2>", _events(events),
            "<h2>Checkpoints</h2>", _checkpoints(run_dir),
            "<h2>Configuration and environment</h2>",
            _config({"environment": _json(run_dir / "environment.json"), **config}),
            "<h2>Step-time breakdown</h2>",
            '<p class="none">Not profiled in training; <code>phalanx bench --profile</code> '
            "splits a step into compute, communication and the rest.</p>"]
    page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Phalanx run '
            f"{_e(run_dir.resolve().name)}</title><style>{STYLE}</style></head><body><main>"
            + "\n".join(body) + "</main></body></html>\n")
    out_path = Path(out_path) if out_path is not None else run_dir / "report.html"
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out_path)
    return out_path


def write_environment(run, cfg, out_dir: Path) -> None:
    """`out_dir/environment.json`: where and with what the run trains (rank 0, at start)."""
    import platform
    import sys

    import torch

    from phalanx import __version__

    device = run.device
    peers = getattr(run.topology, "peers", None)
    env = {"phalanx": __version__, "torch": torch.__version__,
           "python": sys.version.split()[0], "platform": platform.platform(),
           "hosts": ", ".join(sorted(set(peers.hosts))) if peers is not None else "",
           "world_size": run.world_size, "strategy": run.strategy.name,
           "backend": run.backend, "launcher": run.launcher,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "threads_per_rank": run.threads, "precision": cfg.train.precision}
    (Path(out_dir) / "environment.json").write_text(json.dumps(env, indent=2) + "\n")


def _summary(records: list[dict], config: dict, env: dict, status: str) -> str:
    train = config.get("train", {}) if isinstance(config, dict) else {}
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    last = lambda key: next((r[key] for r in reversed(records) if key in r), None)  # noqa: E731
    speed = [r["tokens_per_s"] for r in records if isinstance(r.get("tokens_per_s"), (int, float))]
    step_times = [r["step_time_s"] for r in records if "step_time_s" in r]
    memory = [r["memory_mib"] for r in records if "memory_mib" in r]
    done, total = (max(steps) if steps else 0), train.get("max_steps")
    cards = [
        ("steps", f"{done:,} / {total:,}" if isinstance(total, int) else f"{done:,}"),
        ("final train loss", _num(last("loss"))),
        ("final val loss", _num(last("val_loss"))),
        ("median tokens/s", f"{statistics.median(speed):,.0f}" if speed else "–"),
        ("median step time", f"{statistics.median(step_times):.3f} s" if step_times else "–"),
        ("peak memory, rank 0", f"{max(memory):,.0f} MiB" if memory else "–"),
        ("status", status),
        ("ranks", str(env.get("world_size", "–"))),
        ("strategy", str(env.get("strategy", "–"))),
    ]
    return '<div class="cards">' + "".join(
        f"<div class=card><b>{_e(v)}</b><span>{_e(k)}</span></div>" for k, v in cards) + "</div>"


def _charts(records: list[dict], events: list[dict]) -> str:
    svgs = charts_svg(records, events)
    if not svgs:
        return '<p class="none">No metrics were logged yet.</p>'
    return '<div class="charts">' + "".join(f'<div class="chart">{s}</div>' for s in svgs) + \
        "</div>"


def _events(events: list[dict]) -> str:
    if not events:
        return '<p class="none">None: no restart, no skipped step, no spike, no slow rank.</p>'
    rows = "".join(f"<tr><td class=num>{_e(e.get('step', ''))}</td><td class=kind>"
                   f"{_e(e.get('kind', ''))}</td><td>{_e(e.get('message', ''))}</td>"
                   f"<td class=when>{_e(e.get('time', '').replace('T', ' '))}</td></tr>"
                   for e in events)
    return ("<table><tr><th>step</th><th>event</th><th>what happened</th><th>when</th></tr>"
            f"{rows}</table>")


def _checkpoints(run_dir: Path) -> str:
    from phalanx.checkpoint.store import read_latest

    root = run_dir / "checkpoints"
    found = sorted(p for p in root.glob("step-*") if p.is_dir()) if root.is_dir() else []
    if not found:
        return '<p class="none">No checkpoint was committed.</p>'
    latest = read_latest(root)
    rows = []
    for p in found:
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        mark = " (latest)" if latest is not None and latest.name == p.name else ""
        rows.append(f"<tr><td><code>{_e(p.name)}</code>{mark}</td>"
                    f"<td class=num>{size / 2**20:,.1f} MiB</td></tr>")
    return "<table><tr><th>checkpoint</th><th>size</th></tr>" + "".join(rows) + "</table>"


def _config(config: dict) -> str:
    """One small table per section (`[environment]`, `[model]`, `[data]`, `[train]`,
    `[dist]`), in columns."""
    sections = {name: values for name, values in config.items() if isinstance(values, dict)}
    if not any(sections.values()):
        return '<p class="none">No run_config.json or environment.json.</p>'
    return '<div class="sections">' + "".join(
        f"<div>{_table(values, f'[{name}]')}</div>" for name, values in sections.items()) + \
        "</div>"


def _table(values: dict[str, Any], title: str | None = None) -> str:
    if not values:
        return '<p class="none">Not recorded.</p>'
    head = f'<tr><th colspan="2">{_e(title)}</th></tr>' if title else ""
    rows = "".join(f"<tr><td><code>{_e(k)}</code></td><td><code>{_e(v)}</code></td></tr>"
                   for k, v in values.items())
    return f"<table>{head}{rows}</table>"


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _num(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "–"


def _e(value: Any) -> str:
    return html.escape(str(value))
