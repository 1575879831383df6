"""`phalanx doctor` on 2 gloo ranks: the built-in model passes; a user's model with a
parameter forward never uses and a BatchNorm is diagnosed, naming them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from readme_blocks import doctor_checks  # noqa: E402

USER_MODEL = '''import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))
        self.spare = nn.Linear(8, 8)  # never used in forward

    def forward(self, x):
        return self.body(x)


def make():
    return Net(), torch.randn(6, 4)
'''


def doctor(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", "doctor", "--nproc-per-node", "2",
                           *args], capture_output=True, text=True, timeout=180, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(cwd)})


@pytest.mark.parametrize("strategy", ["ddp", "zero", "fsdp"])
def test_doctor_passes_on_the_builtin_model(tmp_path, strategy):
    proc = doctor("--json", "--strategy", strategy, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert report["failed"] == 0 and set(status.values()) <= {"pass", "warn"}
    grads = "gradients after backward" if strategy == "fsdp" else \
        "gradients identical after backward (different data per rank)"
    for name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier",
                 "parameters and buffers consistent across ranks",
                 "every parameter gets a gradient", grads):
        assert status[name] == "pass", (name, report)
    if strategy != "ddp":
        return
    names, last = doctor_checks()  # the README's table is this run's, checks and count
    assert names == [c["name"] for c in report["checks"]], names
    assert last == f"{len(names)} passed, 0 warnings, 0 failed.", last
    sizes = [row["bytes"] for row in report["bandwidth"]]
    assert sizes == sorted(sizes) and len(sizes) >= 5
    for row in report["bandwidth"]:  # nccl-tests: busbw = algbw * 2(n-1)/n, here n = 2
        assert abs(row["busbw_gbs"] - row["algbw_gbs"]) < 1e-12


def test_doctor_names_an_unused_parameter_and_batchnorm(tmp_path):
    (tmp_path / "usermodel.py").write_text(USER_MODEL)
    proc = doctor("--model", "usermodel:make", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    unused = checks["every parameter gets a gradient"]
    assert unused["status"] == "fail"
    assert unused["evidence"] == "rank 0: no gradient: spare.weight, spare.bias", unused
    assert checks["BatchNorm"]["status"] == "warn"
    assert "SyncBatchNorm cannot run (torch implements it for CUDA only)" in \
        checks["BatchNorm"]["evidence"]
    table = doctor("--model", "usermodel:make", cwd=tmp_path).stdout
    summary = " ".join(table.split()).rsplit("└", 1)[-1]  # every failed check named
    assert "1 warning, 2 failed: every parameter gets a gradient (model) failed;" in summary \
        and summary.endswith("; BatchNorm (model) warned."), summary


def test_doctor_refuses_a_bad_model_spec(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "phalanx", "doctor", "--nproc-per-node", "1",
                           "--model", "nomodule"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 2 and "expected `package.module:factory`" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-only: NCCL and GPU placement")
def test_doctor_on_gpus_uses_nccl_and_one_gpu_per_rank(tmp_path):
    n = torch.cuda.device_count()
    proc = subprocess.run([sys.executable, "-m", "phalanx", "doctor", "--nproc-per-node", str(n),
                           "--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert "this job uses nccl" in status["backends"]["evidence"]
    assert status["LOCAL_RANK → device"]["status"] == "pass"
    assert status["devices (expected cuda:0)"]["status"] == "pass"


def test_doctor_takes_a_factory_written_for_train_model(tmp_path):
    """`phalanx train --model`'s contract (vocab_size=/block_size=, no example): doctor gives
    the keywords and feeds token ids; the replicas and gradients check out."""
    (tmp_path / "user_lm.py").write_text(
        (Path(__file__).resolve().parents[1] / "user_lm.py").read_text())
    proc = doctor("--model", "user_lm:conv_lm", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = {c["name"]: c["status"] for c in json.loads(proc.stdout)["checks"]}
    assert status["every parameter gets a gradient"] == "pass", status
    assert status["gradients identical after backward (different data per rank)"] == "pass"


def test_doctor_checks_a_module_only_factory_without_a_forward(tmp_path):
    """A factory returning only a module (no example, no vocab_size=): structure and
    replicas are checked; no forward is guessed."""
    (tmp_path / "plain.py").write_text(
        "import torch.nn as nn\n\ndef make():\n    return nn.Linear(2, 2)\n")
    proc = doctor("--model", "plain:make", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    status = {c["name"]: c["status"] for c in json.loads(proc.stdout)["checks"]}
    assert status["parameters and buffers consistent across ranks"] == "pass", status
