"""Run inside a private mount namespace (`unshare -m`): `--out` on a tmpfs that is
then filled, then made read-only. Writes what happened as JSON for the test to judge.

Usage: unshare -m python disk_scenarios.py MOUNT CORPUS CACHE RESULT.json
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from phalanx.checkpoint.resume import newest_valid

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--checkpoint-every", "2", "--eval-every", "100",
        "--eval-batches", "1", "--sample-tokens", "0", "--nproc-per-node", "2",
        "--threads-per-rank", "1"]


def train(out: Path, corpus: str, cache: str, steps: int) -> dict:
    proc = subprocess.run([sys.executable, "-m", "phalanx", "train", *ARGS, "--max-steps",
                           str(steps), "--data", corpus, "--cache-dir", cache, "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    return {"rc": proc.returncode, "stderr": proc.stderr, "stdout": proc.stdout}


def state(out: Path) -> dict:
    root = out / "checkpoints"
    newest = newest_valid(root, print)
    return {"newest_valid": newest.name if newest else None,
            "entries": sorted(p.name for p in root.iterdir())}


def fill(path: Path, leave: int) -> None:
    with open(path, "wb") as fh:
        fh.write(b"\0" * max(0, shutil.disk_usage(path.parent).free - leave))


def main(mount: Path, corpus: str, cache: str, result_path: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    out, result = mount / "run", {}
    result["first"] = train(out, corpus, cache, 2)
    fill(mount / "filler", 48 * 1024)  # room for a few log lines, not a checkpoint
    result["full"] = {**train(out, corpus, cache, 4), **state(out)}
    fill(mount / "filler-2", 4 * 1024)  # not even for the metrics the run rewrites
    result["nearly_full"] = {**train(out, corpus, cache, 4), **state(out)}
    for filler in mount.glob("filler*"):
        filler.unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    result["read_only"] = {**train(out, corpus, cache, 4), **state(out)}
    result_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
