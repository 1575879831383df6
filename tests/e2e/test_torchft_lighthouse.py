"""A shared lighthouse (`--lighthouse HOST:PORT`, as the machines of one job share one) and
its loss — issue 45's floor. This launch's groups meet before their first quorum (before:
with a shared lighthouse they did not, and on resume a group without a checkpoint of its
own trained alone from step 1 and then healed the resumed group with its weights). The
lighthouse killed mid-run: every group stops at a step boundary within the quorum timeout
(`--rdzv-timeout-s`) with one line naming the lighthouse, no traceback. A lighthouse back
on the same address: `--resume auto` continues from the last checkpoint to the weights of
the uninterrupted ddp run, bit for bit."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runs import free_port, same_model

pytest.importorskip("torchft", reason="torchft is not installed (pip install 'phalanx[ft]')")

QUORUM_S = 10  # --rdzv-timeout-s: how long a group waits for a quorum
ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "1000", "--log-every", "50",
        "--sample-tokens", "0", "--checkpoint-every", "20", "--max-steps", "300",
        "--hang-timeout-s", "0", "--nproc-per-node", "2", "--threads-per-rank", "1",
        "--tokenizer", "bytes", "--rdzv-timeout-s", str(QUORUM_S)]
# each group's rank holds after step 21 until the test, having seen both groups'
# checkpoints of step 20, killed the lighthouse (a wait: the numbers are not changed)
HOLD = "rank=0,step=21,action=hold"
LIGHTHOUSE = """
import sys, time
from torchft._torchft import LighthouseServer
server = LighthouseServer(bind=sys.argv[1], min_replicas=1, join_timeout_ms=3000,
                          heartbeat_timeout_ms=3000)
print("up", flush=True)
time.sleep(3600)
"""


def _lighthouse(port: int) -> subprocess.Popen:
    house = subprocess.Popen([sys.executable, "-c", LIGHTHOUSE, f"127.0.0.1:{port}"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert house.stdout is not None
    ready = select.select([house.stdout], [], [], 60)[0]
    if not ready or house.stdout.readline().strip() != "up":
        house.kill()
        pytest.fail(f"the lighthouse on 127.0.0.1:{port} did not start within 60 s")
    return house


def _command(out: Path, corpus: Path, cache: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "phalanx", "train", *ARGS, "--data", str(corpus),
            "--cache-dir", str(cache), "--out", str(out), *extra]


def _ft(port: int) -> list[str]:
    return ["--fault-tolerance", "torchft", "--lighthouse", f"127.0.0.1:{port}"]


def _checkpointed(out: Path) -> list[str]:
    """Each group's latest committed checkpoint ("" before its first)."""
    found = []
    for replica in sorted(out.glob("replica-*")):
        latest = replica / "checkpoints" / "latest"
        found.append(latest.read_text().strip() if latest.is_file() else "")
    return found


def _killed_mid_run(out: Path, corpus: Path, cache: Path, port: int) -> tuple[str, float]:
    """Train against the lighthouse on `port`, kill it once both groups have checkpointed
    step 20: what the run said, and how long it took to stop after the kill."""
    house, release = _lighthouse(port), out.parent / "release"
    proc = subprocess.Popen(_command(out, corpus, cache, *_ft(port)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PHALANX_FAULT": HOLD,
                                 "PHALANX_FAULT_RELEASE": str(release)})
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            seen = _checkpointed(out)
            if len(seen) == 2 and all(s >= "step-00000020" for s in seen):
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        house.kill()
        house.wait()
        release.touch()
        killed = time.monotonic()
        said, _ = proc.communicate(timeout=QUORUM_S + 120)
        return said, time.monotonic() - killed
    finally:
        release.touch()  # (a failure before it: no group left holding)
        for p in (house, proc):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_lost_lighthouse_stops_every_group_in_one_line_and_resume_continues_exactly(
        tmp_path, small_corpus_file, cache_dir):
    port, out = free_port(), tmp_path / "run"
    said, took = _killed_mid_run(out, small_corpus_file, cache_dir, port)
    live = [line for line in said.splitlines() if " live (global batch " in line]
    assert live[0].endswith("step 1: 2 replica groups live (global batch 4 sequences)"), live
    named = [line for line in said.splitlines()
             if f"no quorum from the lighthouse at http://127.0.0.1:{port}" in line]
    assert len(named) == 2 and "Traceback" not in said, said[-3000:]
    assert "exited with code 1" in said.splitlines()[-1], said[-3000:]
    assert took < QUORUM_S + 60, took  # the quorum's timeout, and the way out
    stopped = _checkpointed(out)
    house = _lighthouse(port)  # back, on the same address
    try:
        again = subprocess.run(_command(out, small_corpus_file, cache_dir, *_ft(port)),
                               capture_output=True, text=True, timeout=300)
    finally:
        house.kill()
        house.wait()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resumed = [line for line in again.stdout.splitlines() if "resumed from" in line]
    assert len(resumed) == 2 and all(f"at step {int(s[5:])}" in line
                                     for s, line in zip(stopped, sorted(resumed))), resumed
    ddp = subprocess.run(_command(tmp_path / "ddp", small_corpus_file, cache_dir),
                         capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stdout[-3000:] + ddp.stderr[-3000:]
    assert same_model(out, tmp_path / "ddp")
