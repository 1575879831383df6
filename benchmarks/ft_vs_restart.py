"""Time lost per failure: torchft's per-step fault tolerance beside restart-from-checkpoint,
on the same run and the same kill schedule (issue 31).

Both runs train the same model on 2 gloo ranks for the same steps, checkpointing every
`--every` steps. A victim is SIGKILLed each time it has taken `--life` steps since it
(re)started, `--kills` times:
- restart-from-checkpoint (`--max-restarts`): rank 1. The elastic agent stops every rank,
  restarts them all, and they resume from the newest checkpoint (the steps since it are
  trained again).
- torchft (`--fault-tolerance torchft`, 2 replica groups of 1 rank): group 1's rank. Group
  0 goes on alone (half the global batch) while group 1's agent restarts it; group 1
  heals from group 0 and rejoins.

Reported per mode, medians over `--repeats` (each beside an uninterrupted run of the same
mode): wall seconds lost per failure ((killed − uninterrupted) ÷ kills), and for torchft
the group-steps the failures cost in data (steps taken by fewer groups: those samples
were not trained on at that step — the cursor moved by what was read).

    python benchmarks/ft_vs_restart.py --repeats 3          # the figures in the docs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--n-layer", "2", "--n-head", "2", "--n-embd", "128", "--block-size", "64",
         "--micro-batch-size", "8", "--eval-every", "100000", "--eval-batches", "1",
         "--log-every", "1", "--sample-tokens", "0", "--nproc-per-node", "2",
         "--threads-per-rank", "1", "--hang-timeout-s", "0", "--spike-factor", "0",
         "--tokenizer", "bytes"]
MODES = ("restart", "torchft")


@dataclasses.dataclass
class Outcome:
    mode: str
    code: int
    wall_s: float
    kills: int
    console: list = dataclasses.field(default_factory=list)


def command(mode: str, out: Path, corpus: Path, cache: Path, steps: int, every: int,
            extra=()) -> list[str]:
    ft = ["--fault-tolerance", "torchft", "--ft-join-timeout-s", "1"] if mode == "torchft" \
        else []
    return [sys.executable, "-m", "phalanx", "train", *MODEL, *ft, "--max-steps", str(steps),
            "--checkpoint-every", str(every), "--max-restarts", "20", "--data", str(corpus),
            "--cache-dir", str(cache), "--out", str(out), *extra]


def victim(mode: str) -> int | None:
    """The process to kill: torchft group 1's rank, or rank 1 of the restarting job."""
    want = b"PHALANX_FT_GROUP=1" if mode == "torchft" else b"RANK=1"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if want in env and b"PHALANX_LAUNCHED=1" in env and \
                any(v.startswith(b"LOCAL_RANK=") for v in env):
            return int(entry.name)
    return None


def _life(mode: str) -> tuple[re.Pattern, re.Pattern]:
    """(a step line of the victim, the line that says it restarted)."""
    prefix = "g1\\| " if mode == "torchft" else ""
    return re.compile(f"^{prefix}step \\d+/"), re.compile(f"^{prefix}phalanx: restart ")


def punish(mode: str, cmd: list[str], kills: int, life: int, say=print) -> Outcome:
    """Run `cmd`; SIGKILL the victim after each `life` steps of its life, `kills` times."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    step_line, restart_line = _life(mode)
    done, lived = 0, 0
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if restart_line.match(line):
            lived = 0
        elif step_line.match(line):
            lived += 1
            if done < kills and lived >= life:
                pid = victim(mode)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    done, lived = done + 1, 0
                    say(f"{mode}: t={time.monotonic() - start:5.1f}s SIGKILL pid {pid}")
    proc.wait()
    return Outcome(mode, proc.returncode, time.monotonic() - start, done, lines)


def group_steps_lost(out: Path) -> int:
    """torchft: the group-steps not taken (2 groups − live groups, summed over steps)."""
    lines = (out / "replica-0" / "ft-steps.jsonl").read_text().splitlines()
    return sum(2 - json.loads(line)["participants"] for line in lines)


def corpus_file(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from textgen import make_text

    path = folder / "corpus.txt"
    path.write_text(make_text(200_000))
    return path


def measure(ns, tmp: Path) -> dict:
    corpus, cache = corpus_file(tmp), tmp / "cache"
    rows: dict[str, dict[str, list]] = {m: {"lost_s": [], "clean_s": [], "killed_s": [],
                                            "group_steps_lost": []} for m in MODES}
    for rep in range(ns.repeats):
        for mode in MODES:  # side by side, alternating, in one run
            clean = punish(mode, command(mode, tmp / f"{mode}-clean-{rep}", corpus, cache,
                                         ns.steps, ns.every), 0, ns.life)
            killed = punish(mode, command(mode, tmp / f"{mode}-killed-{rep}", corpus, cache,
                                          ns.steps, ns.every), ns.kills, ns.life)
            assert clean.code == 0 and killed.code == 0, "\n".join(killed.console[-30:])
            r = rows[mode]
            r["clean_s"].append(clean.wall_s)
            r["killed_s"].append(killed.wall_s)
            r["lost_s"].append((killed.wall_s - clean.wall_s) / max(1, killed.kills))
            if mode == "torchft":
                r["group_steps_lost"].append(group_steps_lost(tmp / f"{mode}-killed-{rep}")
                                             / max(1, killed.kills))
            print(f"{mode} repeat {rep}: clean {clean.wall_s:.1f} s, killed {killed.wall_s:.1f}"
                  f" s, {killed.kills} kills", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=100, help="checkpoint every N steps")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--life", type=int, default=120,
                        help="steps the victim takes (since it started) before each kill")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="phalanx-ft-") as tmp:
        rows = measure(ns, Path(tmp))
    figures = {m: {k: round(statistics.median(v), 2) if v else None for k, v in r.items()}
               | {"lost_s_range": [round(min(r["lost_s"]), 2), round(max(r["lost_s"]), 2)]}
               for m, r in rows.items()}
    print(json.dumps({"settings": vars(ns), "median": figures}, indent=2))
    if ns.json:
        Path(ns.json).write_text(json.dumps({"settings": vars(ns), "median": figures,
                                             "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
