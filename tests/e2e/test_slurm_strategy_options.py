"""DDP's options reach torch's DDP under a real `srun` (single host: munged + slurmctld +
slurmd, started here), for `phalanx train` and for a user's script.

The defect this guards: under a plain `srun` (what `phalanx slurm` writes) WORLD_SIZE is
unset. The trainer decided the strategy from WORLD_SIZE alone (one rank: `single`, no
options) while `phalanx.init` decided again from SLURM's variables (two ranks: ddp) and
built DDP with torch's defaults — `--bucket-cap-mb 1 --find-unused-parameters` were
dropped without a word. Now the strategy is chosen once, in the worker, from the world
`phalanx.init` joins, and init builds exactly that choice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from slurm_cluster import Cluster, missing  # noqa: E402

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    c.start()
    yield c
    c.stop()


def test_srun_phalanx_train_gives_ddp_the_options(cluster, tmp_path, small_corpus_file,
                                                  cache_dir):
    proc = subprocess.run(
        ["srun", "-n2", sys.executable, "-m", "phalanx", "train", *ARGS, "--bucket-cap-mb", "1",
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
