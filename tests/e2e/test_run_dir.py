"""A run directory is one run with one writer and one lineage (issue 11, items 1-4):
old checkpoints never beat the current run's, rotation never deletes the newest, a
second run on the same `--out` is refused naming the holder, a torn metrics line does
not break resume, and re-running a finished run says so and writes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from phalanx.checkpoint.rundir import LOCK, RunDirLock
from phalanx.checkpoint.store import committed, verify

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "5", "--eval-batches", "1",
        "--sample-tokens", "0", "--nproc-per-node", "1", "--checkpoint-every", "5",
        "--keep-checkpoints", "2"]


def train(out, corpus, cache, *extra: str, fault: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PHALANX_FAULT": fault}
    return subprocess.run(
        [sys.executable, "-m", "phalanx", "train", *ARGS, "--data", str(corpus), "--cache-dir",
         str(cache), "--out", str(out), *extra], capture_output=True, text=True, timeout=180,
        env=env)


def names(out: Path) -> list[str]:
    return [p.name for p in committed(out / "checkpoints")]


def superseded(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "superseded").glob("*/checkpoints/step-*"))


def test_a_fresh_start_moves_the_old_run_and_resume_takes_the_new_one(
        tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    assert train(out, small_corpus_file, cache_dir, "--max-steps", "15").returncode == 0
    assert names(out) == ["step-00000010", "step-00000015"]
    # a new run with other flags, killed after its step 7 (checkpoint 5 committed)
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "20", "--resume", "never",
                 "--lr", "1e-3", fault="rank=0,step=7,phase=step,action=kill")
    assert proc.returncode == -signal.SIGKILL
    assert "moved the previous run in this directory" in proc.stdout
    assert names(out) == ["step-00000005"]
    assert (out / "checkpoints" / "latest").read_text() == "step-00000005"
    assert superseded(out) == ["step-00000010", "step-00000015"]  # moved, not deleted
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "20", "--lr", "1e-3")
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout and "step-00000005 at step 5" in proc.stdout
    assert names(out) == ["step-00000015", "step-00000020"]
    assert all(verify(p) is None for p in committed(out / "checkpoints"))


def test_when_every_checkpoint_is_corrupt_the_new_ones_are_kept(
        tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    assert train(out, small_corpus_file, cache_dir, "--max-steps", "10").returncode == 0
    for ckpt in committed(out / "checkpoints"):
        with open(ckpt / "train_state.json", "a") as fh:
            fh.write(" ")
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "5")
    assert proc.returncode == 0, proc.stderr
    assert names(out) == ["step-00000005"] and verify(out / "checkpoints/step-00000005") is None
    assert superseded(out) == ["step-00000005", "step-00000010"]


def test_resume_moves_checkpoints_newer_than_the_one_continued(
        tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    assert train(out, small_corpus_file, cache_dir, "--max-steps", "10").returncode == 0
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "15", "--resume",
                 str(out / "checkpoints" / "step-00000005"))
    assert proc.returncode == 0, proc.stderr
    assert "checkpoints newer than step-00000005" in proc.stdout
    assert names(out) == ["step-00000010", "step-00000015"]
    assert superseded(out) == ["step-00000010"]


def test_a_second_run_on_the_same_directory_is_refused_naming_the_holder(
        tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    out.mkdir()
    lock = RunDirLock(out).acquire()
    lock.record_holder()
    try:
        proc = train(out, small_corpus_file, cache_dir, "--max-steps", "5")
    finally:
        lock.release()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"is in use by another run (pid {os.getpid()} on" in lines[0]
    assert not (out / "checkpoints").exists()


def test_two_runs_started_together_one_trains_one_is_refused(
        tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "phalanx", "train", *ARGS, "--data", str(small_corpus_file),
           "--cache-dir", str(cache_dir), "--out", str(out), "--max-steps", "10"]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    first_out, first_err = first.communicate(timeout=180)
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 2], (first_err, second.stderr)
    refused = second.stderr if second.returncode == 2 else first_err
    assert "is in use by another run" in refused and "Traceback" not in refused
    assert names(out) == ["step-00000005", "step-00000010"]


def test_a_lock_left_by_a_killed_run_does_not_block(tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from phalanx.checkpoint.rundir import RunDirLock; "
        f"l = RunDirLock({str(out)!r}).acquire(); l.record_holder(); print('held', flush=True); "
        "time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.kill()
    holder.wait()
    assert (out / LOCK).exists()
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "5")
    assert proc.returncode == 0, proc.stderr


def test_a_torn_metrics_line_does_not_break_resume(tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    assert train(out, small_corpus_file, cache_dir, "--max-steps", "5").returncode == 0
    with open(out / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 6, "lo')  # a crash mid-write
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "10")
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout + proc.stderr).count("ends with a torn line") == 1
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [5, 10]


def _snapshot(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(out)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(out.rglob("*"))}


def test_rerunning_a_finished_run_says_so_and_writes_nothing(
        tmp_path, small_corpus_file, cache_dir):
    out = tmp_path / "run"
    assert train(out, small_corpus_file, cache_dir, "--max-steps", "5").returncode == 0
    val = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][-1]
    before = _snapshot(out)
    for steps in ("5", "3"):
        proc = train(out, small_corpus_file, cache_dir, "--max-steps", steps)
        assert proc.returncode == 0, proc.stderr
        assert "is already complete" in proc.stdout and "nan" not in proc.stdout
        assert f"val loss {val['val_loss']:.4f}" in proc.stdout
        assert "done:" not in proc.stdout
        assert _snapshot(out) == before
    assert "past `--max-steps` 3" in proc.stdout


def test_a_torchft_run_in_out_is_refused_not_started_beside(tmp_path, small_corpus_file,
                                                           cache_dir):
    """Issue 39: a run without `--fault-tolerance` on an OUT holding a torchft run started
    over beside it (two lineages in one run directory). Refused in one line, nothing
    written; `--resume never` moves it aside (tests/unit/test_one_run.py)."""
    out = tmp_path / "run"
    for g in (0, 1):
        (out / f"replica-{g}" / "checkpoints" / "step-00000010").mkdir(parents=True)
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "5")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert "holds a `--fault-tolerance torchft` run (`replica-0`, `replica-1`)" in lines[0]
    assert "Add `--fault-tolerance torchft` to continue it" in lines[0], lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["replica-0", "replica-1"]
