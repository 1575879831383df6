"""Two job steps on one node may derive the same store port from their ids (or another
program may hold it): the ranks of a plain `srun` step skip a taken port and a store of
another step, and meet on the next candidate (phalanx.cluster.slurm_store).

srun's environment is given to two local processes here (the port logic is Phalanx's;
SLURM picks no port for it); tests/e2e/test_slurm.py runs the real srun."""

from __future__ import annotations

import datetime
import os
import random
import socket
import subprocess
import sys

import torch.distributed as dist

from phalanx.cluster.slurm_env import candidate_ports
from phalanx.cluster.slurm_store import OWNER

WORKER = """
import os, phalanx
run = phalanx.init(0)
with run:
    total = run.all_reduce_sum(float(run.rank + 1))
print(f"rank {run.rank} sum {total:g} port {os.environ['MASTER_PORT']}", flush=True)
"""


def srun_env(job: int, rank: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "MASTER_", "TORCHELASTIC", "PHALANX_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return {**env, "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2", "SLURM_NODEID": "0",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_NODELIST": "localhost",
            "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


def test_srun_ranks_skip_a_taken_port_and_another_steps_store():
    job = random.randrange(10**5, 10**6)
    ports = candidate_ports({"SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0"})
    squatter = socket.create_server(("0.0.0.0", ports[0]))  # any program on the first
    other = dist.TCPStore("0.0.0.0", ports[1], 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    other.set(OWNER, f"{job + 1}.0")  # another job's step derived the second
    try:
        procs = [subprocess.Popen([sys.executable, "-c", WORKER], env=srun_env(job, r),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in (1, 0)]  # rank 1 first: it must wait for rank 0's store
        done = [p.communicate(timeout=120) for p in procs]
    finally:
        squatter.close()
    for proc, (out, err) in zip(procs, done):
        assert proc.returncode == 0, err[-2000:]
    said = "".join(out for out, _ in done)
    for rank in (0, 1):
        assert f"rank {rank} sum 3 port {ports[2]}" in said, said


def test_reserved_ports_come_first():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURM_STEP_RESV_PORTS": "12000-12002,12010"}
    assert candidate_ports(env) == [12000, 12001, 12002, 12010]
    derived = candidate_ports({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"})
    assert len(set(derived)) == 8 and all(20000 <= p < 40000 for p in derived)
    assert derived[0] == 20000 + (7 * 31 + 1) % 20000  # the port earlier releases derived
    assert candidate_ports({**env, "SLURM_STEP_RESV_PORTS": "x-y"}) == derived
