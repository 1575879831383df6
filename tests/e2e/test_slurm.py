"""Phalanx under a real SLURM (single host: munged + slurmctld + slurmd, started here).

The defect this guards: `srun -n2 phalanx train` used to start each task as a launcher
of its own (srun sets no MASTER_ADDR), so two jobs trained into one `--out`. Now each
task is one rank of one job, meeting on the step's first host.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parents[1]))
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
