"""Count, per process, the command-line parses and strategy decisions of a run (issue 42):
`env(tmp)` puts tests/counting first on PYTHONPATH (its sitecustomize wraps the real
functions) and names the file every process appends to; `read(env)` counts per pid."""

from __future__ import annotations

import collections
import os
from pathlib import Path

COUNTING = Path(__file__).resolve().parent / "counting"


def env(tmp: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    base = dict(os.environ if base is None else base)
    return {**base, "PHALANX_TEST_COUNT": str(tmp / "counts.txt"), "PYTHONPATH": os.pathsep.join(
        [str(COUNTING), base.get("PYTHONPATH", "")])}


def read(environ: dict[str, str]) -> dict[str, collections.Counter]:
    """{pid: Counter(parse=…, choose=…)} of every process that parsed or decided."""
    path = Path(environ["PHALANX_TEST_COUNT"])
    per_pid: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines() if path.exists() else []:
        pid, what = line.split()
        per_pid[pid][what] += 1
    return dict(per_pid)


def parsers(per_pid: dict[str, collections.Counter]) -> list[str]:
    return [pid for pid, c in per_pid.items() if c["parse"]]
