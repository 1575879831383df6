"""A doctor check result and how rank 0 shows them: a table, or JSON."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass

STATUSES = ("pass", "warn", "fail")


@dataclass
class Check:
    area: str  # environment, rendezvous, collectives, performance, network, model
    name: str
    status: str  # pass / warn / fail
    evidence: str
    fix: str = ""


def render_table(checks: list[Check], bandwidth: list[dict]) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="phalanx doctor", show_lines=False)
    fixes = any(c.fix for c in checks)  # no empty `fix` column when every check passed
    for column in ("area", "check", "status", "evidence") + (("fix",) if fixes else ()):
        table.add_column(column, overflow="fold")
    style = {"pass": "green", "warn": "yellow", "fail": "bold red"}
    for c in checks:
        table.add_row(c.area, c.name, f"[{style[c.status]}]{c.status}[/]", c.evidence,
                      *((c.fix,) if fixes else ()))
    # the terminal's width (COLUMNS when set); 120 when the output is not a terminal
    width = shutil.get_terminal_size(fallback=(120, 24)).columns
    console = Console(width=max(60, width), record=True, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
        if bandwidth:
            bw = Table(title="all_reduce bandwidth (nccl-tests definitions: busbw = algbw · "
                             "2(n-1)/n)")
            for column in ("size", "time (ms, median)", "algbw (GB/s)", "busbw (GB/s)"):
                bw.add_column(column, justify="right")
            for row in bandwidth:
                bw.add_row(_size(row["bytes"]), f"{row['ms']:.3f}", f"{row['algbw_gbs']:.3f}",
                           f"{row['busbw_gbs']:.3f}")
            console.print(bw)
        console.print(summary(checks))
    return cap.get()


def summary(checks: list[Check]) -> str:
    """`18 passed, 1 warning, 1 failed: <check> (<area>) failed; …` — every check that
    did not pass named, so a count at the end of a long table can be traced."""
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    warnings = f"{counts['warn']} warning{'' if counts['warn'] == 1 else 's'}"
    named = [f"{c.name} ({c.area}) {'failed' if c.status == 'fail' else 'warned'}"
             for status in ("fail", "warn") for c in checks if c.status == status]
    return (f"{counts['pass']} passed, {warnings}, {counts['fail']} failed"
            + (": " + "; ".join(named) if named else "") + ".")


def as_json(checks: list[Check], bandwidth: list[dict]) -> str:
    return json.dumps({"checks": [asdict(c) for c in checks], "bandwidth": bandwidth,
                       "failed": sum(c.status == "fail" for c in checks)}, indent=2)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024
    return str(n)
