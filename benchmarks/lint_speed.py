"""`phalanx lint` throughput: lines of real Python per second, all rules, one process.

    python benchmarks/lint_speed.py [PATH ...]   (default: the installed torch package)
    python benchmarks/lint_speed.py --against OLD/src --pairs 6 [PATH ...]

Reports files, lines, seconds (median of 3 passes) and lines/s; files that are not
valid Python for this interpreter are counted and skipped. A pass is what `phalanx lint`
does: the cross-file call graph and facts first (`lint.project.build_project`), then every
file.

`--against`: another Phalanx's `src` (e.g. `git worktree add /tmp/old REV`, then
`/tmp/old/src`), side by side: pairs of fresh processes, old then new, each timing one pass
after a warm one, in CPU seconds (this machine's wall clock is shared); prints both
medians and new/old per pair with their median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one_pass(files: list[Path]) -> tuple[float, int, int, int]:
    from phalanx.lint.engine import collector_paused, lint_source
    from phalanx.lint.project import build_project
    from phalanx.lint.rules import ALL

    lines = skipped = findings = 0
    t0 = time.perf_counter()
    with collector_paused():  # as `phalanx lint` runs
        modules = build_project(files)
        for path in files:
            source = path.read_text(encoding="utf-8", errors="replace")
            try:
                findings += len(lint_source(str(path), source, ALL, modules))
            except (SyntaxError, ValueError, RecursionError):
                skipped += 1
                continue
            lines += source.count("\n") + 1
    return time.perf_counter() - t0, lines, skipped, findings


def _roots(paths: list[str]) -> list[str]:
    if paths:
        return paths
    import torch
    return [str(Path(torch.__file__).parent)]


def _timed_pass(src: str, roots: list[str]) -> tuple[float, int]:
    """(CPU seconds of one pass after a warm one, lines) in a fresh process on `src`."""
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, __file__, "--one-pass", *roots], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), int(out[1])


def side_by_side(old: str, roots: list[str], pairs: int) -> None:
    new = str(Path(__file__).resolve().parents[1] / "src")
    times: dict[str, list[float]] = {"old": [], "new": []}
    lines = 0
    for _ in range(pairs):
        for name, src in (("old", old), ("new", new)):
            seconds, lines = _timed_pass(src, roots)
            times[name].append(seconds)
    for name, found in times.items():
        median = statistics.median(found)
        print(f"{name}: {median:.2f} CPU s (median of {pairs}; {min(found):.2f}–"
              f"{max(found):.2f}) → {lines / median:,.0f} lines/s")
    ratios = [n / o for n, o in zip(times["new"], times["old"])]
    print(f"new/old per pair: {' '.join(f'{r:.3f}' for r in ratios)}; median "
          f"{statistics.median(ratios):.3f}")


def main() -> None:
    from phalanx.lint.files import python_files

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--against", help="another Phalanx's src folder, timed side by side")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--one-pass", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    roots = _roots(args.paths)
    if args.against:
        side_by_side(args.against, roots, args.pairs)
        return
    files = list(python_files(roots))
    if args.one_pass:
        one_pass(files)
        start = time.process_time()
        _, lines, _, _ = one_pass(files)
        print(f"{time.process_time() - start:.3f} {lines}")
        return
    runs = [one_pass(files) for _ in range(3)]
    seconds = statistics.median(r[0] for r in runs)
    _, lines, skipped, findings = runs[0]
    print(f"{len(files)} files ({skipped} skipped), {lines:,} lines, {findings:,} findings: "
          f"{seconds:.1f} s (median of 3) → {lines / seconds:,.0f} lines/s")


if __name__ == "__main__":
    main()
