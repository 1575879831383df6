"""What an MLflow tracker costs a training step, and what a tracking server that goes
down mid-run costs (issue 48): three runs of the same `phalanx train` per round, in
alternating order, on 2 gloo ranks:

- `none`: no tracker;
- `live`: `--tracker mlflow`, the server up throughout;
- `down`: `--tracker mlflow`, the server SIGKILLed once rank 0 has logged step `--kill-at`
  (MLflow's client then retries with backoff for minutes; Phalanx's tracker logs from a
  background queue and drops the tracker after 30 s without an answer).

Each run's step time is the median `step_time_s` in its `metrics.jsonl` over the steps
after `--kill-at` (the same steps in every arm). Reported: the per-round ratios down/live,
live/none and down/none, their medians with a bootstrap 95 % interval, and the goal
(down/live ≤ 1.10: "step time within 10 % of the live run's").

    python benchmarks/tracker_overhead.py --repeats 4 --steps 150   # the docs' figures

The `down` arm needs a fresh server each round (an MLflow server with its SQLite
migrations takes 30-60 s to start here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

from mlflow_server import Server  # noqa: E402
from phalanx.bench.stats import ratio_interval, verdict  # noqa: E402

MODEL = ["--n-layer", "2", "--n-head", "2", "--n-embd", "128", "--block-size", "64",
         "--micro-batch-size", "8", "--eval-every", "100000", "--eval-batches", "1",
         "--log-every", "1", "--sample-tokens", "0", "--nproc-per-node", "2",
         "--threads-per-rank", "1", "--hang-timeout-s", "0", "--tokenizer", "bytes"]
ARMS = ("none", "live", "down")


def step_times(out: Path, after: int) -> list[float]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step_time_s"] for r in rows if "step_time_s" in r and r["step"] > after]


def run_arm(arm: str, out: Path, ns, corpus: Path,
            server: Server | None) -> tuple[float, float]:
    """One run of `arm`: its median step time over the steps after --kill-at, and its wall
    time (the command's start to its exit: a tracker's end counts there)."""
    env = dict(os.environ)
    tracker: list[str] = []
    if server is not None:
        env |= {"MLFLOW_TRACKING_URI": server.uri, "MLFLOW_EXPERIMENT_NAME": "overhead"}
        tracker = ["--tracker", "mlflow"]
    argv = [sys.executable, "-m", "phalanx", "train", *MODEL, *tracker, "--max-steps",
            str(ns.steps), "--data", str(corpus), "--cache-dir", str(out.parent / "cache"),
            "--out", str(out)]
    begun = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    if arm == "down":
        assert server is not None
        while not _logged(out, ns.kill_at):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            time.sleep(0.05)
        server.stop()
    said, _ = proc.communicate(timeout=1800)
    wall = time.monotonic() - begun
    assert proc.returncode == 0, said[-3000:]
    warned = [line for line in said.splitlines() if "warning: tracker mlflow" in line]
    assert len(warned) == (arm == "down"), (arm, warned)
    return statistics.median(step_times(out, ns.kill_at)), wall


def _logged(out: Path, step: int) -> bool:
    try:
        text = (out / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return False
    return any(json.loads(line).get("step", 0) >= step for line in text.splitlines()
               if line.endswith("}"))


def measure(ns, tmp: Path) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    from textgen import make_text

    corpus = tmp / "corpus.txt"
    corpus.write_text(make_text(200_000))
    rows: dict[str, list[float]] = {arm: [] for arm in ARMS}
    walls: dict[str, list[float]] = {arm: [] for arm in ARMS}
    live = Server(tmp / "live-server")
    try:
        for rep in range(ns.repeats):
            down = Server(tmp / f"down-server-{rep}")
            servers = {"none": None, "live": live, "down": down}
            order = ARMS if rep % 2 == 0 else ARMS[::-1]
            for arm in order:
                step, wall = run_arm(arm, tmp / f"{arm}-{rep}", ns, corpus, servers[arm])
                rows[arm].append(step)
                walls[arm].append(wall)
            down.stop()
            print(f"round {rep}: " + ", ".join(
                f"{a} {rows[a][-1] * 1000:.1f} ms/step, {walls[a][-1]:.1f} s" for a in ARMS),
                flush=True)
    finally:
        live.stop()
    return rows, walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--kill-at", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="phalanx-tracker-") as tmp:
        rows, walls = measure(ns, Path(tmp))
    figures: dict = {"median_step_ms": {a: round(statistics.median(v) * 1000, 2)
                                        for a, v in rows.items()},
                     "median_wall_s": {a: round(statistics.median(v), 1)
                                       for a, v in walls.items()}}
    for a, b in (("down", "live"), ("live", "none"), ("down", "none")):
        mid, low, high = ratio_interval(rows[a], rows[b])
        figures[f"{a}/{b}"] = {"median": round(mid, 3), "ci95": [round(low, 3), round(high, 3)]}
    mid, low, high = ratio_interval(rows["down"], rows["live"])
    figures["goal down/live <= 1.10"] = verdict(low, high, 1.10)
    print(json.dumps({"settings": vars(ns), **figures}, indent=2))
    if ns.json:
        Path(ns.json).write_text(json.dumps({"settings": vars(ns), **figures, "runs": rows},
                                            indent=2))


if __name__ == "__main__":
    main()
