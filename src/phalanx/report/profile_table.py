"""The run report's step-time breakdown: `OUT/profile/summary.json` (written by
`--profile-steps A-B` or a script's `run.profile()`, runtime.profiling) as tables — per
rank, the profiled steps' wall time split into the labelled phases, the time the main
thread spent in collectives, and the rest; then rank 0's top operators. Values it cannot
use (not numbers, not finite) are shown as "–", never trusted."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from phalanx.report.records import Warn, as_float, read_object

PHASES = ("data", "forward", "backward", "optimizer")
NOT_PROFILED = ('<p class="none">Not profiled: <code>phalanx train --profile-steps 5-7</code> '
                "(or <code>with run.profile():</code> in a script) writes a per-rank torch "
                "profiler trace and this breakdown; <code>phalanx bench --profile</code> "
                "measures the exposed communication.</p>")


def profile_section(profile_dir: Path, warn: Warn) -> str:
    if profile_dir.is_symlink():  # the report follows no link in the run directory
        warn(f"phalanx: warning: `{profile_dir}` is a symbolic link, not followed; the "
             "report leaves the profile out.")
        return NOT_PROFILED
    summary = read_object(profile_dir / "summary.json", warn)  # ({} when absent)
    ranks = summary.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return NOT_PROFILED
    steps = summary.get("steps")
    which = (f"steps {steps[0]}–{steps[1]}" if isinstance(steps, list) and len(steps) == 2
             and all(isinstance(s, int) for s in steps) and steps[0] > 0 else "the block")
    head = ("<tr><th>rank</th><th>wall</th>" + "".join(f"<th>{p}</th>" for p in PHASES)
            + "<th>in collectives</th><th>rest</th></tr>")
    rows = [_rank_row(r, found) for r, found in enumerate(ranks)]
    traces = ", ".join(f"<code>profile/rank-{r}.json.gz</code>" for r in range(len(ranks)))
    return (f"<p>torch.profiler over {html.escape(which)}, ms per step. <i>in collectives</i>"
            " is the time recorded in collective operations (c10d calls and the backend's "
            "own work, on any thread: it overlaps the phases); "
            "<i>rest</i> is the wall time outside the phases (logging, evaluation, "
            "checkpoints, waiting for other ranks). Traces (Chrome/Perfetto: "
            f"<code>ui.perfetto.dev</code>): {traces}.</p>"
            f"<table>{head}{''.join(rows)}</table>" + _top_ops(ranks[0]))


def _ms(value: Any) -> str:
    v = as_float(value)
    return f"{v:.2f}" if v is not None and math.isfinite(v) and v >= 0 else "–"


def _rank_row(rank: int, found: Any) -> str:
    found = found if isinstance(found, dict) else {}
    phases = found.get("phases_ms") if isinstance(found.get("phases_ms"), dict) else {}
    cells = [found.get("wall_ms"), *(phases.get(p) for p in PHASES),
             found.get("collectives_ms"), found.get("rest_ms")]
    return (f"<tr><td>{rank}</td>"
            + "".join(f'<td class="num">{_ms(c)}</td>' for c in cells) + "</tr>")


def _top_ops(found: Any) -> str:
    ops = found.get("top_ops_ms") if isinstance(found, dict) else None
    rows = [f'<tr><td><code>{html.escape(str(op[0]))}</code></td><td class="num">'
            f"{_ms(op[1])}</td></tr>" for op in (ops if isinstance(ops, list) else [])
            if isinstance(op, list) and len(op) == 2]
    if not rows:
        return ""
    return ("<h3>Top operators by self time (rank 0, ms per step)</h3>"
            f"<table><tr><th>operator</th><th>ms</th></tr>{''.join(rows)}</table>")
