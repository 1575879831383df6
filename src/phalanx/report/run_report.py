"""`OUT/report.html`: one self-contained page per run (no script, no network) — a summary,
charts of loss, validation loss, learning rate, throughput, step time, gradient norm and
memory, the run's events (restarts, NaN-guard skips, spikes, slow ranks), its
checkpoints, its configuration and environment. Written at the end of `phalanx train`
and of `phalanx run`; `phalanx report RUN_DIR` rebuilds it from the files, e.g. after a
failed run, or of a run a user's script wrote through the library API (`run.log`,
`run.save`).

It always renders: what it reads is checked first (report.records) and a record it
cannot use is skipped with one warning per file; it never follows a symbolic link in
the run directory (report.listing); it shows what the run recorded it used, never a
raw `None` (report.used). Only a page path that cannot be written is an error, the
user's (report.outfile)."""

from __future__ import annotations

import html
import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.cluster import protocol
from phalanx.cluster.faults import announcement
from phalanx.paths import RunDir, atomic_write
from phalanx.report import used
from phalanx.report.charts import charts_svg
from phalanx.report.events import read_events, record_event
from phalanx.report.goodput import summarise
from phalanx.report.listing import list_checkpoints, recorded_world_size
from phalanx.report.outfile import PageFile
from phalanx.report.profile_table import profile_section
from phalanx.report.records import Warn, check_metric, finite, read_object, read_records, whole_step
from phalanx.version import __version__

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


@dataclass
class RunFiles:
    """What the report read from a run directory, checked."""
    records: list[dict[str, Any]]
    events: list[dict[str, Any]]
    config: dict[str, Any]
    env: dict[str, Any]


def build_report(run_dir: Path, out_path: Path | None = None, warn: Warn | None = None
                 ) -> Path:
    """Write the report of the run in `run_dir` (default: `run_dir/report.html`). Records
    it cannot use are skipped with one line per file through `warn` (default: stderr);
    a page path that cannot be written raises UserError, before anything is read."""
    names = RunDir(run_dir)
    run_dir = names.root
    given = out_path is not None
    with PageFile(Path(out_path) if out_path is not None else names.report, run_dir,
                  given) as page:
        warn = warn or _stderr
        files = RunFiles(records=read_records(names.metrics, check_metric, warn),
                         events=read_events(run_dir, warn),
                         config=read_object(names.run_config, warn),
                         env=read_object(names.environment, warn))
        name = run_dir.resolve().name
        return page.commit(f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
                           f"<title>Phalanx run {_e(name)}</title><style>{STYLE}</style>"
                           "</head><body><main>" + "\n".join(_body(run_dir, files, warn))
                           + "</main></body></html>\n")


def _body(run_dir: Path, files: RunFiles, warn: Warn) -> list[str]:
    checkpoints, latest, note = list_checkpoints(run_dir)
    config, env = files.config, files.env
    facts = {"status": used.status(run_dir, config, files.events), "strategy": used.strategy(env),
             "ranks": used.ranks(env, recorded_world_size(run_dir, checkpoints, latest))}
    good = summarise(run_dir, warn)
    if good is not None:
        facts["goodput"] = f"{good.share:.0%} of {good.wall_s:,.0f} s"
    return [f"<h1>Phalanx run: {_e(run_dir.resolve().name)}</h1>",
            f'<div class="sub">{_e(str(run_dir.resolve()))}</div>',
            _summary(files.records, config, facts),
            "<h2>Charts</h2>", _charts(files.records, files.events,
                                        used.loss_unit(env, config)),
            "<h2>Events</h2>", _events(files.events, used.trainer_run(config)),
            "<h2>Checkpoints</h2>", _checkpoints(checkpoints, latest, note),
            "<h2>Configuration and environment</h2>",
            _config({"environment": used.shown_environment(env),
                     **used.shown_config(config, env)}),
            "<h2>Step-time breakdown</h2>", profile_section(RunDir(run_dir).profile, warn)]


def write_environment(run, cfg, out_dir: Path) -> None:
    """`out_dir/environment.json`: where and with what the run trains (rank 0, at start:
    `phalanx.init` for a run directory, cfg None; the trainer then with its `cfg`).
    `loss_unit`: the trainer's loss is cross-entropy per token, in nats (a byte is a
    token with `--tokenizer bytes`); `val_nats_per_byte` compares tokenizers."""
    import platform

    import torch

    from phalanx.config.data_spec import resolve_spec

    device = run.device
    peers = getattr(run.topology, "peers", None)
    env = {"phalanx": __version__, "torch": torch.__version__,
           "python": sys.version.split()[0], "platform": platform.platform(),
           "hosts": ", ".join(sorted(set(peers.hosts))) if peers is not None else "",
           "world_size": run.world_size, "strategy": run.strategy.label,
           "backend": run.backend, "launcher": run.launcher,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "threads_per_rank": run.threads}
    if cfg is not None:
        tokenizer = resolve_spec(cfg.data.tokenizer, cfg.data.path)
        env.update(precision=cfg.train.precision, tokenizer=tokenizer,
                   loss_unit="nats/byte" if tokenizer == "bytes" else "nats/token")
    fault = os.environ.get(protocol.FAULT)
    if fault:  # injected faults change this run's results: said where they are read
        env[protocol.FAULT] = fault
    atomic_write(RunDir(out_dir).environment, (json.dumps(env, indent=2) + "\n").encode())
    if fault:
        record_event(out_dir, "fault", 0, announcement(fault).removeprefix("phalanx: "))


def _summary(records: list[dict], config: dict, facts: dict[str, str]) -> str:
    train = found if isinstance(found := config.get("train"), dict) else {}
    last = lambda key: next((r[key] for r in reversed(records) if key in r), None)  # noqa: E731
    figures = {key: finite([r[key] for r in records if key in r])
               for key in ("tokens_per_s", "step_time_s", "memory_mib")}
    speed, step_times, memory = figures.values()
    done = max((r["step"] for r in records), default=0)
    total = train.get("max_steps")
    cards = [
        ("steps", f"{done:,} / {total:,}" if whole_step(total) else f"{done:,}"),
        ("final train loss" if used.trainer_run(config) else "final loss", _num(last("loss"))),
        ("final val loss", _num(last("val_loss"))),
        *([("final val nats/byte", _num(last("val_nats_per_byte")))]
          if last("val_nats_per_byte") is not None and last("val_nats_per_byte")
          != last("val_loss") else []),
        ("median tokens/s", _num(statistics.median(speed), ",.0f") if speed else "–"),
        ("median step time", _num(statistics.median(step_times), ".3f") + " s"
         if step_times else "–"),
        ("peak memory, rank 0", _num(max(memory), ",.0f") + " MiB" if memory else "–"),
        *([("goodput (steps kept / wall)", facts["goodput"])] if "goodput" in facts else []),
        ("status", facts["status"]),
        ("ranks", facts["ranks"]),
        ("strategy", facts["strategy"]),
    ]
    return '<div class="cards">' + "".join(
        f"<div class=card><b>{_e(v)}</b><span>{_e(k)}</span></div>" for k, v in cards) + "</div>"


def _charts(records: list[dict], events: list[dict], loss_unit: str | None) -> str:
    charts = charts_svg(records, events, loss_unit)
    if not charts:
        return '<p class="none">No metrics were logged yet.</p>'
    return '<div class="charts">' + "".join(
        f'<div class="chart" role="img" aria-label="{_e(label)}">{svg}</div>'
        for label, svg in charts) + "</div>"


def _events(events: list[dict], trainer: bool) -> str:
    if not events and trainer:  # the trainer records each of these when it happens
        return '<p class="none">None: no restart, no skipped step, no spike, no slow rank.</p>'
    if not events:
        return ('<p class="none">No events recorded (<code>phalanx train</code> and '
                '<code>phalanx run</code> record them).</p>')
    rows = "".join(f"<tr><td class=num>{_e(e['step'])}</td><td class=kind>"
                   f"{_e(e['kind'])}</td><td>{_e(e['message'])}</td>"
                   f"<td class=when>{_e(e.get('time', '').replace('T', ' '))}</td></tr>"
                   for e in events)
    return ("<table><tr><th>step</th><th>event</th><th>what happened</th><th>when</th></tr>"
            f"{rows}</table>")


def _checkpoints(found: list, latest: str | None, note: str | None) -> str:
    if not found:
        return f'<p class="none">{_e(note or "No checkpoint was committed.")}</p>'
    rows = []
    for c in found:
        if c.link:
            rows.append(f"<tr><td><code>{_e(c.name)}</code></td>"
                        "<td class=none>symbolic link, not followed</td></tr>")
            continue
        notes = [f"{c.links} symbolic link{'s' if c.links > 1 else ''} inside, not followed"
                 ] if c.links else []
        notes += [f"{c.unreadable} folder(s) inside could not be read"] if c.unreadable else []
        mark = " (latest)" if c.name == latest else ""
        said = "".join(f" <span class=none>({_e(n)})</span>" for n in notes)
        rows.append(f"<tr><td><code>{_e(c.name)}</code>{mark}{said}</td>"
                    f"<td class=num>{c.size / 2**20:,.1f} MiB</td></tr>")
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
    rows = "".join(f"<tr><td><code>{_e(k)}</code></td><td><code>{_e(_cell(v))}</code></td></tr>"
                   for k, v in values.items())
    return f"<table>{head}{rows}</table>"


def _cell(value: Any) -> str:
    """A config value as written in JSON (`null`, `[1, 2]`), text as it is."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (ValueError, RecursionError):
        return str(value)


def _num(value: Any, spec: str = ".4f") -> str:
    """`value` formatted by `spec`; beyond a trillion, in 4 significant digits (1e+308
    stays short)."""
    if not isinstance(value, (int, float)):
        return "–"
    return format(value, ".4g" if abs(value) >= 1e12 else spec)


def _e(value: Any) -> str:
    return html.escape(str(value))


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
