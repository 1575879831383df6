"""`phalanx lint` throughput: lines of real Python per second, all rules, one process.

    python benchmarks/lint_speed.py [PATH ...]   (default: the installed torch package)

Reports files, lines, seconds (median of 3 passes) and lines/s; files that are not
valid Python for this interpreter are counted and skipped. A pass is what `phalanx lint`
does: the cross-file call graph and facts first (`lint.project.build_project`), then every
file.
"""

from __future__ import annotations

import statistics
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


def main() -> None:
    from phalanx.lint.files import python_files

    if len(sys.argv) > 1:
        roots = sys.argv[1:]
    else:
        import torch
        roots = [str(Path(torch.__file__).parent)]
    files = list(python_files(roots))
    runs = [one_pass(files) for _ in range(3)]
    seconds = statistics.median(r[0] for r in runs)
    _, lines, skipped, findings = runs[0]
    print(f"{len(files)} files ({skipped} skipped), {lines:,} lines, {findings:,} findings: "
          f"{seconds:.1f} s (median of 3) → {lines / seconds:,.0f} lines/s")


if __name__ == "__main__":
    main()
