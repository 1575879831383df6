"""`phalanx run --strategy NAME` (issue 42): the launcher's strategy is what
`phalanx.init` builds in a script that names none, and a script whose
`phalanx.init(strategy=…)` contradicts it is refused in one line naming the rank —
not trained with a strategy its command line does not say."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """import os
import torch
import phalanx

run = phalanx.init(seed=0, strategy=os.environ.get("ASK") or None)
model, opt = run.setup(torch.nn.Linear(4, 1), lambda p: torch.optim.SGD(p, lr=0.1))
print(f"rank {run.rank}: {run.strategy.name}", flush=True)
"""


def _run(tmp_path, out: str, ask: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "s.py").write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ASK": ask or ""}
    return subprocess.run([sys.executable, "-m", "phalanx", "run", "--nproc-per-node", "2",
                           "--strategy", "fsdp", "--out", out, "s.py"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=180)


def test_the_launchers_strategy_is_built_and_a_contradiction_is_one_line(tmp_path):
    agreed = _run(tmp_path, "named-none", None)
    assert agreed.returncode == 0, agreed.stderr[-3000:]
    assert "rank 0: fsdp" in agreed.stdout, agreed.stdout  # not ddp, the 2-rank default
    assert "rank 1: fsdp" in (tmp_path / "named-none/logs/rank-1.log").read_text()
    same = _run(tmp_path, "named-same", "fsdp")
    assert same.returncode == 0 and "rank 0: fsdp" in same.stdout, same.stderr[-3000:]
    other = _run(tmp_path, "named-other", "ddp")
    assert other.returncode == 2, other.stderr[-3000:]
    [line] = [s for s in other.stderr.splitlines() if s.startswith("phalanx: error:")]
    assert "[rank " in line and "phalanx.init(strategy='ddp')" in line, line
    assert "`phalanx run --strategy fsdp`" in line, line
    assert "Traceback" not in other.stderr and "rank 0:" not in other.stdout
