"""100 Ctrl-C / SIGTERM stops at random moments (tests/e2e/test_stop_stress.py, issue 41.1),
on demand — about an hour on 2 cores; not beside the suite (CI runs one stop per moment):

    python benchmarks/stop_stress.py [N] [--seed S] [--out benchmarks/results/stop_stress_100.txt]

Runs the test with PHALANX_STOP_STRESS=N and writes the command, the commit, the stops
per moment (passed / failed) and the wall time to the results file.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/e2e/test_stop_stress.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=100, help="stops (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="PHALANX_STOP_STRESS_SEED")
    parser.add_argument("--out", default=None, help="results file (default: "
                        "benchmarks/results/stop_stress_N.txt)")
    ns = parser.parse_args()
    out = Path(ns.out or ROOT / f"benchmarks/results/stop_stress_{ns.n}.txt")
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", TEST, "-k",
           "test_a_stop"]
    env = {**os.environ, "PHALANX_STOP_STRESS": str(ns.n),
           "PHALANX_STOP_STRESS_SEED": str(ns.seed)}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip()
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for moment, _sig, verdict in re.findall(
            r"test_a_stop_at_any_moment\[\d+-(.+?)-(SIG\w+)\] (PASSED|FAILED|ERROR)",
            done.stdout):
        counts[moment][verdict] += 1
    lines = [f"command: PHALANX_STOP_STRESS={ns.n} PHALANX_STOP_STRESS_SEED={ns.seed} "
             f"{' '.join(cmd[1:])}",
             f"commit: {commit}{' (with uncommitted changes)' if dirty else ''}",
             f"wall time: {wall:.0f} s", f"pytest exit: {done.returncode}", "stops per moment:"]
    lines += [f"  {m}: {c['PASSED']} passed, {c['FAILED'] + c['ERROR']} failed"
              for m, c in counts.items()]
    total = sum(c["PASSED"] for c in counts.values())
    lines.append(f"total: {total}/{ns.n} passed")
    failed = [ln for ln in done.stdout.splitlines() if ln.startswith(("FAILED", "ERROR", "E "))]
    if failed:  # why each failed: pytest's assertion lines, for the record
        lines += ["failures:", *(f"  {ln[:600]}" for ln in failed[:80])]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
