"""Phalanx under a real SLURM (single host: munged + slurmctld + slurmd, started here).

The defect this guards: `srun -n2 phalanx train` used to start each task as a launcher
of its own (srun sets no MASTER_ADDR), so two jobs trained into one `--out`. Now each
task is one rank of one job, meeting on the step's first host.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parents[1]))
from readme_snippet import failing_script, seconds_since_the_raise  # noqa: E402
from slurm_cluster import Cluster, missing  # noqa: E402

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--max-steps", "6", "--eval-every", "3",
        "--checkpoint-every", "3", "--sample-tokens", "0"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    c.start()
    yield c
    c.stop()


def test_srun_two_tasks_train_as_one_two_rank_job(cluster, tmp_path, small_corpus_file,
                                                   cache_dir):
    data = ["--data", str(small_corpus_file), "--cache-dir", str(cache_dir)]
    proc = subprocess.run(["srun", "-n2", sys.executable, "-m", "phalanx", "train", *ARGS,
                           *data, "--out", str(tmp_path / "slurm")], env=cluster.env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("phalanx: 2 rank(s)") == 1, proc.stdout  # one job, one banner
    assert proc.stdout.count("done: 6 steps") == 1
    checkpoints = sorted(p.name for p in (tmp_path / "slurm" / "checkpoints").glob("step-*"))
    assert checkpoints == ["step-00000003", "step-00000006"]
    local = subprocess.run([sys.executable, "-m", "phalanx", "train", *ARGS, *data,
                            "--nproc-per-node", "2", "--out", str(tmp_path / "local")],
                           capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr[-2000:]
    a = load_file(str(tmp_path / "slurm" / "model.safetensors"))
    b = load_file(str(tmp_path / "local" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_slurm_submit_warning_signal_requeues_and_resumes_exactly(
        cluster, tmp_path, small_corpus_file, cache_dir):
    """`phalanx slurm --submit`; SIGUSR1 (what `--signal=USR1@S` sends before the time
    limit) mid-run: every rank commits a checkpoint and exits 138, the script requeues the
    job, and the requeued job resumes to the same weights as an uninterrupted run."""
    args = [*ARGS, "--max-steps", "400", "--checkpoint-every", "1000", "--eval-every", "1000",
            "--log-every", "1", "--data", str(small_corpus_file), "--cache-dir", str(cache_dir)]
    out = tmp_path / "job"
    submitted = subprocess.run([sys.executable, "-m", "phalanx", "slurm", *args, "--out",
                                str(out), "--ntasks-per-node", "2", "--cpus-per-task", "1",
                                "--time", "00:20:00", "--submit"], env=cluster.env,
                               capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[2].rstrip(":")
    script = (out / "phalanx.sbatch").read_text()
    assert "#SBATCH --signal=USR1@90" in script and "scontrol requeue" in script
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            (out / "metrics.jsonl").is_file()
            and len((out / "metrics.jsonl").read_text().splitlines()) >= 30):
        time.sleep(0.2)
    assert subprocess.run(["scancel", "--signal=USR1", job], env=cluster.env).returncode == 0
    seen, deadline, pending_since = [], time.monotonic() + 300, None
    while time.monotonic() < deadline:
        state, reason = cluster.job_state(job)
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == "PENDING" and reason == "BeginTime":  # SLURM holds a requeued job ~2 min
            pending_since = pending_since or time.monotonic()  # so that the last run's
            if time.monotonic() - pending_since > 5:  # cleanup ends first; a test waits 5 s
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"],
                               env=cluster.env, capture_output=True)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        time.sleep(0.3)
    log = (out / f"slurm-{job}.out").read_text()
    shown = subprocess.run(["scontrol", "show", "job", job], env=cluster.env,
                           capture_output=True, text=True).stdout
    assert seen[-1] == "COMPLETED" and "PENDING" in seen, (seen, shown, log[-3000:])
    assert log.count("phalanx: stopped by SIGUSR1: checkpoint step-") == 1, log[-3000:]
    assert "resumed from" in log and log.count("done: 400 steps") == 1
    straight = subprocess.run([sys.executable, "-m", "phalanx", "train", *args,
                               "--nproc-per-node", "2", "--out", str(tmp_path / "straight")],
                              capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-2000:]
    a = load_file(str(out / "model.safetensors"))
    b = load_file(str(tmp_path / "straight" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in b)


# DDP's options reach torch's DDP under a plain `srun`, for `phalanx train` and for a user's
# script. The defect: WORLD_SIZE is unset under srun; the trainer decided the strategy from
# it alone (`single`, no options) while `phalanx.init` decided again from SLURM's variables
# (ddp) and built DDP with torch's defaults — `--bucket-cap-mb 1 --find-unused-parameters`
# were dropped without a word. Now the strategy is chosen once, from the world init joins.
OPTION_ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--max-steps", "2", "--eval-every", "2",
        "--checkpoint-every", "2", "--sample-tokens", "0"]
# what rank 0 says once DDP is built: read back from torch's DistributedDataParallel
TUNED = "phalanx: ddp: DistributedDataParallel built with bucket_cap_mb=1, " \
        "find_unused_parameters=True"

SCRIPT = '''
import json

import torch
import torch.nn as nn

import phalanx


class TwoHeads(nn.Module):
    """`unused` takes no part in the loss: DDP fails its second step unless it searches
    for unused parameters."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x):
        return self.used(x)


with phalanx.init(seed=0, threads=1, strategy="ddp", bucket_cap_mb=1,
                  find_unused_parameters=True) as run:
    model, opt = run.setup(TwoHeads(), lambda p: torch.optim.SGD(p, lr=0.1))
    for _ in range(3):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    print(json.dumps({"rank": run.rank, "world": run.world_size,
                      "wrapper": type(model).__name__,
                      "bucket_bytes_cap": model.bucket_bytes_cap,
                      "find_unused_parameters": model.find_unused_parameters}), flush=True)
'''


def test_srun_phalanx_train_gives_ddp_the_options(cluster, tmp_path, small_corpus_file,
                                                  cache_dir):
    proc = subprocess.run(
        ["srun", "-n2", sys.executable, "-m", "phalanx", "train", *OPTION_ARGS, "--bucket-cap-mb", "1",
         "--find-unused-parameters", "--data", str(small_corpus_file), "--cache-dir",
         str(cache_dir), "--out", str(tmp_path / "run")],
        env=cluster.env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("phalanx: 2 rank(s)") == 1, proc.stdout  # one job
    assert "strategy ddp" in proc.stdout, proc.stdout
    assert proc.stderr.count(TUNED) == 1, proc.stderr  # rank 0 says it, once


def test_srun_user_script_gives_ddp_the_options(cluster, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(["srun", "-n2", sys.executable, str(script)], env=cluster.env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    seen = sorted((json.loads(line) for line in proc.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])
    assert seen == [{"rank": r, "world": 2, "wrapper": "PhalanxDDP",
                     "bucket_bytes_cap": 2 ** 20, "find_unused_parameters": True}
                    for r in (0, 1)], proc.stdout
    assert proc.stderr.count(TUNED) == 1, proc.stderr


def test_srun_an_exception_on_one_rank_ends_the_step_within_seconds(cluster, tmp_path):
    """The README's snippet as written, rank 0 raising at step 3: no barrier at exit."""
    script = failing_script(tmp_path)
    proc = subprocess.run(["srun", "-n2", sys.executable, str(script)], env=cluster.env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    took = seconds_since_the_raise(tmp_path)  # srun's start-up not counted
    assert proc.returncode != 0 and took < 10, (took, proc.stderr[-2000:])
    assert proc.stderr.count("ValueError: bad batch at step 3") == 1, proc.stderr[-3000:]


# `phalanx slurm … run SCRIPT ARGS` (issue 27): the job runs a user's script under
# `phalanx run`; each task is one rank of one job, the script gets its own arguments and
# OUT as its run directory.
TINY = '''
import json
import os
import sys

import phalanx

with phalanx.init(seed=0, threads=1) as run:
    total = run.all_reduce_sum(float(run.rank + 1))
    seen = {"rank": run.rank, "world": run.world_size, "sum": total, "args": sys.argv[2:],
            "run_dir": os.environ.get("PHALANX_RUN_DIR")}
    with open(os.path.join(sys.argv[1], f"rank-{run.rank}.json"), "w") as f:
        json.dump(seen, f)
'''


def test_slurm_submit_run_script_runs_it_as_one_two_rank_job(cluster, tmp_path):
    script, seen, out = tmp_path / "tiny.py", tmp_path / "seen", tmp_path / "job"
    script.write_text(TINY)
    seen.mkdir()
    submitted = subprocess.run(
        [sys.executable, "-m", "phalanx", "slurm", "--ntasks-per-node", "2", "--cpus-per-task",
         "1", "--time", "00:05:00", "--out", str(out), "--submit", "run", "tiny.py", str(seen), "--lr",
         "3e-4"], env=cluster.env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[2].rstrip(":")
    state, deadline = "?", time.monotonic() + 180
    while time.monotonic() < deadline:
        state, _ = cluster.job_state(job)
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        time.sleep(0.3)
    log = out / f"slurm-{job}.out"
    assert state == "COMPLETED", (state, log.read_text()[-3000:] if log.exists() else "")
    ranks = [json.loads(p.read_text()) for p in sorted(seen.glob("rank-*.json"))]
    assert ranks == [{"rank": r, "world": 2, "sum": 3.0, "args": ["--lr", "3e-4"],
                      "run_dir": str(out.resolve())} for r in (0, 1)], log.read_text()[-3000:]
