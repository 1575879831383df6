"""Start-up: seconds from `phalanx train` (the default job, a fresh run directory) to its
first console line, to its first progress line, and to the end of the first optimizer
step — medians over repeats, with where the time goes.

Each repeat starts `phalanx train --out TMP/run-K` as a user would (its own process,
stdout a pipe), timestamps every console line as it arrives, and stops the job once the
first step is reported. The line `step 1/2500 | first step done …` is printed by rank 0
right after the first optimizer step, so its arrival is the end of that step. The
breakdown comes from `PHALANX_STARTUP_TRACE`: each process appends what it reached and
when (launcher: imported, config, corpus checked, workers started; each worker: started,
imported, process group, model built, resume checked, first step).

    python benchmarks/startup.py [--repeats 5] [-- extra train flags]

`--end` times the other end instead: a tiny 2-rank run to completion, from its last
console line ("done: …", then "wrote: …") to the command's exit — what a user waits for
the prompt. `--baseline-src DIR` runs another tree's Phalanx (`DIR` on PYTHONPATH, e.g. a
`git worktree` of an older commit's `src`) beside it, the two alternating:

    python benchmarks/startup.py --end --repeats 5 --baseline-src /tmp/old/src
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIRST_STEP = "first step done"
TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "4", "--max-steps", "6", "--eval-every", "3", "--log-every", "2",
        "--sample-tokens", "20", "--nproc-per-node", "2"]


def one_start(out: Path, trace: Path, extra: list[str]) -> dict[str, float]:
    env = {**os.environ, "PHALANX_STARTUP_TRACE": str(trace), "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "train", "--out", str(out),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    seen: dict[str, float] = {}
    try:
        for line in proc.stdout:
            now = time.time() - t0
            seen.setdefault("first line", now)
            if line.startswith("step ") and "progress line" not in seen:
                seen["progress line"] = now
            if FIRST_STEP in line:
                seen["first step"] = now
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if "first step" not in seen:
        raise SystemExit(f"`phalanx train` ended before its first step: {seen}")
    return {**seen, **phases(trace, t0)}


def phases(trace: Path, t0: float) -> dict[str, float]:
    """Seconds from the command to each traced point (when the last process that passes
    it does: every rank has reached it)."""
    reached: dict[str, float] = {}
    for line in trace.read_text().splitlines() if trace.is_file() else []:
        when, _, label = line.split(" ", 2)
        reached[label] = max(reached.get(label, 0.0), float(when) - t0)
    return reached


def one_end(out: Path, extra: list[str], src: str | None) -> float:
    """Seconds from a finished run's last console line to the command's exit."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "train", *TINY, *extra, "--out",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    last, lines = time.time(), []
    for line in proc.stdout:
        last = time.time()
        lines.append(line)
    if proc.wait() != 0:
        raise SystemExit(f"`phalanx train` failed:\n{''.join(lines[-20:])}")
    return time.time() - last


def ends(repeats: int, extra: list[str], baseline: str | None) -> None:
    trees = {"this tree": None, **({f"baseline ({baseline})": baseline} if baseline else {})}
    times: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="phalanx-end-") as tmp:
        one_end(Path(tmp) / "warm", extra, None)  # the corpus cache
        for k in range(repeats):
            for name, src in trees.items():
                times[name].append(one_end(Path(tmp) / f"{len(times[name])}-{k}-{bool(src)}",
                                           extra, src))
    print(f"a tiny 2-rank `phalanx train` run's last line to its exit, {repeats} runs each "
          f"(seconds; median [min, max]):")
    for name, values in times.items():
        print(f"  {name:40s} {statistics.median(values):6.2f}  [{min(values):.2f}, "
              f"{max(values):.2f}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--end", action="store_true",
                        help="time a tiny run's last line to its exit instead")
    parser.add_argument("--baseline-src", help="with --end: another tree's src beside it")
    parser.add_argument("extra", nargs="*", help="more `phalanx train` flags (after --)")
    args = parser.parse_args()
    if args.end:
        return ends(args.repeats, args.extra, args.baseline_src)
    with tempfile.TemporaryDirectory(prefix="phalanx-startup-") as tmp:
        one_start(Path(tmp) / "warm", Path(tmp) / "warm.trace", args.extra)  # corpus cache
        runs = [one_start(Path(tmp) / f"run-{k}", Path(tmp) / f"{k}.trace", args.extra)
                for k in range(args.repeats)]
    labels = sorted({k for r in runs for k in r}, key=lambda k: statistics.median(
        r.get(k, float("inf")) for r in runs))
    print(f"`phalanx train {' '.join(args.extra)}` from a fresh run directory, corpus cache "
          f"warm, {args.repeats} starts (seconds from the command; median [min, max]):")
    for label in labels:
        values = [r[label] for r in runs if label in r]
        print(f"  {label:32s} {statistics.median(values):6.2f}  [{min(values):.2f}, "
              f"{max(values):.2f}]")
    first = statistics.median(r["progress line"] for r in runs)
    step = statistics.median(r["first step"] for r in runs)
    print(f"first progress line {first:.2f} s (goal <= 4), end of the first optimizer step "
          f"{step:.2f} s (goal <= 8)")


if __name__ == "__main__":
    main()
