"""One job, decided once (issue 42): under Phalanx's launcher the command line is parsed
once, by the launcher, which writes the job (`OUT/job.json`); each worker starts from it
and decides only its attempt — the strategy for the world it joined, once per process.
Counted in a real 2-rank run by wrapping the real functions (tests/counting)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import job_counts
from phalanx.version import __version__

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--checkpoint-every", "2", "--eval-every", "100",
        "--eval-batches", "1", "--sample-tokens", "0", "--nproc-per-node", "2",
        "--threads-per-rank", "1", "--max-steps", "2"]


def _counted_run(tmp_path: Path, argv: list[str]):
    environ = job_counts.env(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "phalanx", *argv], env=environ,
                          capture_output=True, text=True, timeout=300)
    return proc, job_counts.read(environ)


def test_a_two_rank_run_parses_once_and_each_process_decides_once(tmp_path, corpus_file,
                                                                    cache_dir):
    out = tmp_path / "run"
    proc, per_pid = _counted_run(tmp_path, ["train", *ARGS, "--data", str(corpus_file),
                                            "--cache-dir", str(cache_dir), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsers = job_counts.parsers(per_pid)
    assert len(parsers) == 1 and per_pid[parsers[0]]["parse"] == 1, dict(per_pid)
    workers = [pid for pid in per_pid if pid not in parsers]
    assert len(workers) == 2, dict(per_pid)  # each worker decided, none parsed
    assert all(c["choose"] == 1 for c in per_pid.values()), dict(per_pid)

    job = json.loads((out / "job.json").read_text())
    assert job["format"] == 2 and job["phalanx"] == __version__ and job["verb"] == "train"
    # the layout requested, in the config: nothing given (each attempt resolves it)
    assert {d: job["config"]["dist"][d] for d in ("pp", "dp_replicate", "dp_shard", "tp")} \
        == {"pp": None, "dp_replicate": None, "dp_shard": None, "tp": None}
    assert job["out"] == str(out.absolute()) and job["argv"][-2:] == ["--out", str(out)]
    assert job["config"]["train"]["max_steps"] == 2
    assert job["config"]["dist"]["nproc_per_node"] == 2
    assert job["verified"] is None  # a fresh start: nothing to resume

    more = ARGS[:-2] + ["--max-steps", "4"]  # ARGS ends with `--max-steps 2`
    proc, per_pid = _counted_run(tmp_path, ["train", *more, "--data", str(corpus_file),
                                            "--cache-dir", str(cache_dir), "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = json.loads((out / "job.json").read_text())["verified"]
    assert resumed.startswith(f"{(out / 'checkpoints' / 'step-00000002').resolve()}|")
    counts = sum(per_pid.values(), collections.Counter())
    # the step-2 checkpoint's files are read once per start, by the launcher; rank 0, handed
    # the job's token, checks its manifest only (the step-4 commit verifies nothing here)
    assert (counts["verify-full"], counts["verify-manifest"]) == (1, 1), dict(per_pid)


def test_an_option_of_another_strategy_is_refused_before_anything_is_decided(tmp_path,
                                                                            corpus_file,
                                                                            cache_dir):
    """`auto` on 2 ranks is ddp: an fsdp option is refused in one line by the config's
    check, before a strategy is decided, a worker starts or a job is written."""
    out = tmp_path / "run"
    proc, per_pid = _counted_run(tmp_path, ["train", *ARGS, "--fsdp-grad-sync", "last",
                                            "--data", str(corpus_file), "--cache-dir",
                                            str(cache_dir), "--out", str(out)])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        "phalanx: error: `--fsdp-grad-sync` is an option of `--strategy fsdp`, and this run "
        "uses `ddp`: it would have no effect. Drop it, or choose that strategy."]
    assert len(per_pid) == 1 and not (out / "job.json").exists(), per_pid
    assert not any(c["choose"] for c in per_pid.values()), per_pid
