"""How a job ends (issue 11, items 5, 6 and 9): workers die with their launcher; the
first Ctrl-C / SIGTERM commits a checkpoint and prints the resume command (exit 130 /
143), a second stops at once, never leaving a worker behind; and a single-node job's
processes listen on loopback only."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import procs
from phalanx.checkpoint.store import committed, verify

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "1000", "--eval-batches", "1",
        "--log-every", "1", "--sample-tokens", "0", "--checkpoint-every", "1000",
        "--nproc-per-node", "2", "--threads-per-rank", "1"]


def start(out: Path, corpus, cache, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "phalanx", "train", *ARGS, "--data", str(corpus),
         "--cache-dir", str(cache), "--out", str(out), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_step(proc: subprocess.Popen, step: int) -> None:
    if not procs.wait_for_step(proc.stdout, step):
        raise AssertionError(f"the run ended before step {step}: {proc.stderr.read()}")


def test_workers_die_with_a_sigkilled_launcher(tmp_path, small_corpus_file, cache_dir):
    proc = start(tmp_path / "run", small_corpus_file, cache_dir, "--max-steps", "100000")
    wait_for_step(proc, 3)
    workers = procs.descendants(proc.pid)
    assert len(workers) >= 2
    proc.kill()
    proc.wait()
    assert procs.gone_within(workers, 10), f"orphaned workers: {procs.alive(workers)}"


@pytest.mark.parametrize("sig,nproc", [  # CI: SIGTERM on 2 ranks is in test_stop_stress
    (signal.SIGINT, "2"), pytest.param(signal.SIGTERM, "2", marks=pytest.mark.full),
    (signal.SIGTERM, "1")])
def test_first_signal_commits_a_checkpoint_and_resume_is_exact(
        sig, nproc, tmp_path, small_corpus_file, cache_dir):
    """Two ranks under the elastic agent, and one rank in the launcher's own process."""
    out = tmp_path / "run"
    proc = start(out, small_corpus_file, cache_dir, "--max-steps", "100000",
                 "--nproc-per-node", nproc)
    wait_for_step(proc, 4)
    workers = procs.descendants(proc.pid)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stdout + stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"stopped by {sig.name}: checkpoint step-" in lines[0], lines
    assert "Resume with: phalanx train" in lines[0]
    assert procs.gone_within(workers, 5)
    [ckpt] = committed(out / "checkpoints")
    assert verify(ckpt) is None
    stop = int(ckpt.name.split("-")[1])
    said = re.search(rf"^phalanx: {sig.name} received after step (\d+) of 100000: stopping "
                     r"after the step in progress", stdout, re.M)  # at once, on rank 0
    assert said and stop - int(said.group(1)) in (0, 1), (stop, stdout[-2000:])
    # continue to stop + 2 and compare with a run that was never interrupted
    target = str(stop + 2)
    same = ["--max-steps", target, "--lr-decay-steps", "100000", "--nproc-per-node", nproc]
    resumed = subprocess.run([sys.executable, "-m", "phalanx", "train", *ARGS, "--data",
                              str(small_corpus_file), "--cache-dir", str(cache_dir), "--out",
                              str(out), *same], capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0 and f"at step {stop}" in resumed.stdout, resumed.stderr
    straight = subprocess.run([sys.executable, "-m", "phalanx", "train", *ARGS, "--data",
                               str(small_corpus_file), "--cache-dir", str(cache_dir), "--out",
                               str(tmp_path / "straight"), *same],
                              capture_output=True, text=True, timeout=180)
    assert straight.returncode == 0, straight.stderr
    a, b = load_file(out / "model.safetensors"), load_file(tmp_path / "straight/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_second_signal_stops_at_once(tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    proc = start(out, small_corpus_file, cache_dir, "--max-steps", "100000")
    wait_for_step(proc, 2)
    workers = procs.descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode in (130, -signal.SIGINT)
    assert procs.gone_within(workers, 10), f"orphaned workers: {procs.alive(workers)}"
    for ckpt in committed(out / "checkpoints"):  # whatever was committed is whole
        assert verify(ckpt) is None


def test_a_single_node_job_listens_on_loopback_only(tmp_path, small_corpus_file, cache_dir):
    proc = start(tmp_path / "run", small_corpus_file, cache_dir, "--max-steps", "100000")
    try:
        wait_for_step(proc, 3)
        listeners = procs.listening({proc.pid} | procs.descendants(proc.pid))
    finally:
        proc.kill()
        proc.communicate()
    assert len(listeners) >= 2, listeners  # the rendezvous store and the agent's store
    outside = [x for x in listeners if not procs.on_loopback(x)]
    assert not outside, f"listening beyond loopback: {outside}"


def test_ss_shows_only_loopback_listeners(tmp_path, small_corpus_file, cache_dir):
    if shutil.which("ss") is None:
        pytest.skip("`ss` (iproute2) is not installed; the /proc test above covers the same")
    proc = start(tmp_path / "run", small_corpus_file, cache_dir, "--max-steps", "100000")
    try:
        wait_for_step(proc, 3)
        pids = {proc.pid} | procs.descendants(proc.pid)
        table = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    finally:
        proc.kill()
        proc.communicate()
    ours = [row.split()[3] for row in table.splitlines()
            if any(f"pid={pid}," in row for pid in pids)]
    assert len(ours) >= 2, table
    assert all(a.startswith(("127.", "[::1]")) for a in ours), ours
