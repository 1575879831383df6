"""A chaos run in the style of torchft's "punisher" (issue 25, item 2).

`phalanx train` on 2 gloo ranks with `--max-restarts` large, while every 10-20 s (at
random, counted from the first step after each start) one of these is SIGKILLed:
- a random rank (torch's elastic agent restarts every rank; they resume from the newest
  committed checkpoint),
- a rank in the middle of a checkpoint write (the driver waits for `.tmp-step-*`),
- the whole job's launcher (its workers die with it; the driver starts the same command
  again, as a scheduler's requeue would).
The run must finish, every restart must be one console line, and the final weights
must be bit-identical to an uninterrupted run's. Reports failures survived, time lost
per failure (wall time over the uninterrupted run's, divided by the failures) and the
console lines.

    python benchmarks/chaos.py --minutes 4            # the figures in the README
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"^step (\d+)/\d+ ")
MODEL = ["--n-layer", "2", "--n-head", "2", "--n-embd", "64", "--block-size", "32",
         "--micro-batch-size", "4", "--eval-every", "100", "--eval-batches", "2",
         "--log-every", "10", "--sample-tokens", "0", "--nproc-per-node", "2",
         "--threads-per-rank", "1", "--hang-timeout-s", "0"]


@dataclasses.dataclass
class ChaosResult:
    kills: list = dataclasses.field(default_factory=list)  # (seconds, what)
    launches: int = 0
    wall_s: float = 0.0
    console: list = dataclasses.field(default_factory=list)
    exit_codes: list = dataclasses.field(default_factory=list)


def train_command(out: Path, corpus: Path, cache: Path, steps: int, every: int) -> list[str]:
    return [sys.executable, "-m", "phalanx", "train", *MODEL, "--max-steps", str(steps),
            "--checkpoint-every", str(every), "--max-restarts", "1000", "--data", str(corpus),
            "--cache-dir", str(cache), "--out", str(out)]


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _workers(launcher: int) -> list[int]:
    """The ranks: the launcher's python children (the agent runs in the launcher)."""
    return [p for p in _children(launcher) if _is_python(p)]


def _is_python(pid: int) -> bool:
    try:
        return "python" in Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return False


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def _mid_write(out: Path, launcher: subprocess.Popen, limit_s: float) -> int | None:
    """A rank while a checkpoint is being written (None: no write seen in `limit_s`)."""
    end = time.monotonic() + limit_s
    root = out / "checkpoints"
    while time.monotonic() < end and launcher.poll() is None:
        if root.is_dir() and any(p.name.startswith(".tmp-step-") for p in root.iterdir()):
            ranks = _workers(launcher.pid)
            if ranks:
                return random.choice(ranks)
        time.sleep(0.002)
    return None


def _pump(stream, sink: list) -> None:
    for line in stream:
        sink.append(line.rstrip("\n"))


def _await_progress(proc: subprocess.Popen, lines: list, seen: int,
                    limit_s: float = 300) -> tuple[int, int]:
    """Wait for a life's first step after console line `seen` (the gap between kills is counted
    from the first step of each life, so a slow start-up on a loaded machine still
    leaves every life its training); the index to wait past next time, and that step."""
    end = time.monotonic() + limit_s
    while proc.poll() is None and time.monotonic() < end:
        firsts = [line for line in lines[seen:] if "first step done" in line]
        if firsts:
            return len(lines), _step_of(firsts[-1]) or 0
        time.sleep(0.05)
    return len(lines), 0


def _step_of(line: str) -> int | None:
    """N of a console line `step N/TOTAL | …` (None for other lines)."""
    found = STEP_LINE.match(line)
    return int(found.group(1)) if found else None


def _live(proc: subprocess.Popen, lines: list, first: int, gap: float, in_steps: bool) -> None:
    """Let the life that started at step `first` train `gap` seconds (or, `in_steps`, until it
    logs step `first + gap`: as many kills on a slow machine as on a fast one)."""
    deadline = time.monotonic() + (300 if in_steps else gap)
    while proc.poll() is None and time.monotonic() < deadline:
        if in_steps and max((_step_of(line) or 0 for line in lines[-3:]), default=0) >= first + gap:
            return
        time.sleep(0.02 if in_steps else 0.05)


def punish(out: Path, corpus: Path, cache: Path, steps: int, every: int,
           gap: tuple[float, float], seed: int = 0, say=print,
           in_steps: bool = False) -> ChaosResult:
    """Train to `steps` under kills every `gap` seconds (`in_steps`: every `gap` steps, counted
    from each life's first step); relaunch a killed launcher."""
    rng = random.Random(seed)
    result, start = ChaosResult(), time.monotonic()
    while True:
        result.launches += 1
        proc = subprocess.Popen(train_command(out, corpus, cache, steps, every),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        reader = threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True)
        reader.start()
        seen = 0
        while proc.poll() is None:
            seen, first = _await_progress(proc, lines, seen)
            _live(proc, lines, first, rng.uniform(*gap), in_steps)
            if proc.poll() is not None:
                break
            what = rng.choice(["rank", "mid-write", "launcher"])
            target = (proc.pid if what == "launcher" else
                      _mid_write(out, proc, 10.0) if what == "mid-write" else
                      (rng.choice(_workers(proc.pid)) if _workers(proc.pid) else None))
            if target is not None and _kill(target):
                result.kills.append((round(time.monotonic() - start, 1), what))
                say(f"chaos: t={time.monotonic() - start:6.1f}s SIGKILL {what} (pid {target})")
        reader.join(timeout=30)
        result.console += lines
        result.exit_codes.append(proc.returncode)
        if proc.returncode == 0:
            break
        if proc.returncode != -signal.SIGKILL:  # only a killed launcher is relaunched
            break
    result.wall_s = time.monotonic() - start
    return result


def straight_run(out: Path, corpus: Path, cache: Path, steps: int, every: int) -> float:
    start = time.monotonic()
    subprocess.run(train_command(out, corpus, cache, steps, every), check=True,
                   capture_output=True, text=True)
    return time.monotonic() - start


def same_weights(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def corpus_file(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from textgen import make_text

    path = folder / "corpus.txt"
    path.write_text(make_text(200_000))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0,
                        help="about how long the chaos run lasts (sets --max-steps)")
    parser.add_argument("--gap", type=float, nargs=2, default=(10.0, 20.0),
                        help="seconds between kills, drawn uniformly")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the figures here too")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="phalanx-chaos-") as tmp:
        tmp = Path(tmp)
        corpus, cache = corpus_file(tmp), tmp / "cache"
        short = straight_run(tmp / "probe-a", corpus, cache, 40, 20)  # start-up + 40 steps
        longer = straight_run(tmp / "probe-b", corpus, cache, 240, 20)
        per_step = max((longer - short) / 200, 1e-3)
        steps = max(100, int((ns.minutes * 60 - short) / per_step))  # the uninterrupted run
        every = max(10, steps // 40)
        base = straight_run(tmp / "straight", corpus, cache, steps, every)
        chaos = punish(tmp / "chaos", corpus, cache, steps, every, tuple(ns.gap), ns.seed)
        report(ns, steps, every, base, chaos, same_weights(tmp / "straight", tmp / "chaos"))


def report(ns, steps: int, every: int, base: float, chaos: ChaosResult, exact: bool) -> None:
    restarts = [line for line in chaos.console if line.startswith("phalanx: restart")]
    lost = (chaos.wall_s - base) / max(1, len(chaos.kills))
    figures = {"steps": steps, "checkpoint_every": every, "straight_s": round(base, 1),
               "chaos_s": round(chaos.wall_s, 1), "failures": len(chaos.kills),
               "by_kind": {k: sum(1 for _, w in chaos.kills if w == k)
                           for k in ("rank", "mid-write", "launcher")},
               "launches": chaos.launches, "restart_lines": len(restarts),
               "lost_s_per_failure": round(lost, 1), "bit_identical": exact,
               "tracebacks": sum("Traceback" in line for line in chaos.console),
               "exit_codes": chaos.exit_codes}
    print(json.dumps(figures, indent=1))
    if ns.json:
        Path(ns.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
