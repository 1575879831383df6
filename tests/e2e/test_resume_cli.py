"""`--resume` from the command line: what is refused (exit 2, one message), what is
allowed and logged, and an `--out` on a full or read-only disk."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.checkpoint.store import verify

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "100", "--eval-batches", "1",
        "--sample-tokens", "0", "--nproc-per-node", "1"]


def train(out, corpus, cache, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "phalanx", "train", *ARGS, "--data", str(corpus), "--cache-dir",
         str(cache), "--out", str(out), *extra], capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, small_corpus_file, cache_dir):
    out = tmp_path_factory.mktemp("resume") / "run"
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "2")
    assert proc.returncode == 0, proc.stderr
    return out


def assert_one_message(proc, needle: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], lines


def test_a_missing_resume_path_is_refused(run_dir, small_corpus_file, cache_dir, tmp_path):
    proc = train(tmp_path / "new", small_corpus_file, cache_dir, "--resume", str(tmp_path / "nope"))
    assert_one_message(proc, f"`--resume` path `{tmp_path / 'nope'}` does not exist")


def test_a_resume_path_that_is_no_checkpoint_is_refused(small_corpus_file, cache_dir, tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    proc = train(tmp_path / "new", small_corpus_file, cache_dir, "--resume", str(tmp_path / "junk"))
    assert_one_message(proc, "is not a checkpoint and holds no valid checkpoint")


def test_another_model_shape_is_refused_naming_the_fields(run_dir, small_corpus_file, cache_dir):
    proc = train(run_dir, small_corpus_file, cache_dir, "--max-steps", "4", "--n-embd", "64",
                 "--n-layer", "2")
    assert_one_message(proc, "was written for another model shape: --n-layer 1 → 2, "
                             "--n-embd 32 → 64")
    proc = train(run_dir, small_corpus_file, cache_dir, "--max-steps", "4", "--nproc-per-node",
                 "2", "--n-embd", "64")  # refused before any worker starts
    assert_one_message(proc, "--n-embd 32 → 64")


def test_a_changed_learning_rate_and_length_are_allowed_and_logged(run_dir, small_corpus_file,
                                                                 cache_dir, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(run_dir, out)
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "3", "--lr", "0.001")
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout and "at step 2" in proc.stdout
    assert "--lr 0.002 → 0.001" in proc.stdout and "--max-steps 2 → 3" in proc.stdout
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 3


def test_extending_a_finished_schedule_says_what_the_learning_rate_does(
        small_corpus_file, cache_dir, tmp_path):
    out = tmp_path / "run"
    short = ("--warmup-steps", "1", "--log-every", "1", "--lr-schedule", "cosine")
    assert train(out, small_corpus_file, cache_dir, "--max-steps", "4", *short).returncode == 0
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "8", "--lr-decay-steps", "8",
                 *short)  # as a user extends a run that used the default (its max steps)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("resumed from"))
    assert ("the cosine schedule now spans 8 steps instead of 4: at step 5 the learning rate "
            "is 1.30e-03 where the old schedule had 2.00e-04 (a jump up). To go on at the old "
            "rate instead, resume with `--lr-decay-steps 4`") in line, line
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text()
                                          .splitlines())}
    assert f"{lrs[5]:.2e}" == "1.30e-03"  # the message says what the run then did
    ok = tmp_path / "planned"
    planned = ("--lr-decay-steps", "8", *short)  # the final length from the start: no jump
    assert train(ok, small_corpus_file, cache_dir, "--max-steps", "4", *planned).returncode == 0
    proc = train(ok, small_corpus_file, cache_dir, "--max-steps", "8", *planned)
    assert "cosine schedule" not in proc.stdout and "--max-steps 4 → 8" in proc.stdout


def test_resuming_on_fewer_ranks_names_the_smaller_global_batch(small_corpus_file, cache_dir,
                                                                  tmp_path):
    out = tmp_path / "run"
    two = train(out, small_corpus_file, cache_dir, "--max-steps", "2", "--nproc-per-node", "2")
    assert two.returncode == 0, two.stderr
    proc = train(out, small_corpus_file, cache_dir, "--max-steps", "3")
    assert proc.returncode == 0, proc.stderr
    assert ("changed: --max-steps 2 → 3, the global batch is 2 sequences per step instead of 4 "
            "(2 → 1 ranks); "
            "to keep 4, resume with `--grad-accum 2`") in proc.stdout, proc.stdout


def test_a_full_or_read_only_disk_keeps_the_previous_checkpoint(small_corpus_file, cache_dir,
                                                                tmp_path):
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs `unshare -m` (root) to mount a small tmpfs for --out")
    mount = tmp_path / "mnt"
    mount.mkdir()
    script = Path(__file__).parent / "disk_scenarios.py"
    subprocess.run(["unshare", "-m", sys.executable, str(script), str(mount),
                    str(small_corpus_file), str(cache_dir), str(tmp_path / "r.json")],
                   check=True, timeout=600)
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["first"]["rc"] == 0, result["first"]["stderr"]
    full, read_only = result["full"], result["read_only"]
    assert_one_message(_Proc(full), "[rank 0] writing checkpoint step-00000004 failed: No space "
                                    "left on device. The previous checkpoints in")
    assert_one_message(_Proc(read_only), "is not a writable directory (Read-only file system)")
    # a write outside the checkpoint fails: the metrics or logs a rank writes, or the
    # launcher's probe of --out (which write meets the full disk first depends on the few
    # bytes the "full" run left behind: CI saw both)
    nearly = result["nearly_full"]
    assert_one_message(_Proc(nearly), "No space left on device writing")
    assert f"`{mount / 'run'}" in nearly["stderr"]  # the file, or the run it was for
    assert "not a writable directory" not in nearly["stderr"]  # full is not read-only
    assert "Free space or choose a writable location (e.g. `--out`)" in nearly["stderr"]
    for outcome in (full, nearly, read_only):
        assert outcome["newest_valid"] == "step-00000002"  # verified by its manifest
        assert outcome["entries"] == ["latest", "step-00000002"]  # no temporary left


class _Proc:
    def __init__(self, outcome: dict) -> None:
        self.returncode, self.stdout, self.stderr = outcome["rc"], outcome["stdout"], \
            outcome["stderr"]


def test_verify_is_what_resume_trusts(run_dir):
    assert verify(run_dir / "checkpoints" / "step-00000002") is None
