"""`phalanx.init` on a GPU: nccl at world size 1, the device pinned from LOCAL_RANK, and
torch's NCCL flight recorder read back as the hang report reads it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from cuda_helpers import scenario

from runs import free_port

pytestmark = pytest.mark.cuda


def launcher_env(local_rank: int, local_world: int) -> dict[str, str]:
    """The variables torchrun sets, for a 1-rank job whose rank sits at `local_rank`."""
    port = free_port()
    return {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def test_nccl_at_world_size_one_in_a_plain_process(tmp_path):
    got = scenario("pinning", tmp_path)
    assert got["backend"] == "nccl" and got["pg_backend"] == "nccl"
    assert got["device"] == "cuda:0" and got["current_device"] == 0
    assert got["sum"] == 2.0 and got["tensor_device"] == "cuda:0"


def test_the_device_is_pinned_from_local_rank_under_a_launcher(tmp_path, figure):
    got = scenario("pinning", tmp_path, launcher_env(0, 1))
    assert (got["backend"], got["device"], got["current_device"]) == ("nccl", "cuda:0", 0)
    figure("nccl", version=got["nccl"], device=got["device_name"])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs to pin LOCAL_RANK 1")
def test_local_rank_one_is_pinned_to_the_second_gpu(tmp_path):
    got = scenario("pinning", tmp_path, launcher_env(1, 2))
    assert (got["device"], got["current_device"]) == ("cuda:1", 1)


def test_a_local_rank_without_a_gpu_is_refused_in_words(tmp_path):
    n = torch.cuda.device_count()
    env = {**launcher_env(n, n + 1), "PYTHONUNBUFFERED": "1"}
    code = "import phalanx; phalanx.init(seed=0)"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0
    assert f"LOCAL_RANK {n} has no GPU: only {n} visible" in proc.stderr


def test_the_flight_recorder_dump_is_read_as_the_hang_report_reads_it(tmp_path, figure):
    got = scenario("flight", tmp_path, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    assert got["dumped"], "torch._C._distributed_c10d._dump_nccl_trace gave no dump"
    last = got["last"]
    assert last is not None and got["entries"] >= 1
    assert last["op"] == "all_reduce" and last["input_sizes"] == [[1234]], last
    assert last["state"] in ("scheduled", "started", "completed")
    assert any("rank 0: #" in line and "all_reduce [1234]" in line for line in got["section"])
    figure("flight recorder", version=got["version"], last=last)
