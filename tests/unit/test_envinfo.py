"""Launcher detection from environment variables alone."""

from __future__ import annotations

import pytest

from phalanx.cluster.env import detect_launch_env
from phalanx.cluster.protocol import under_launcher
from phalanx.cluster.slurm_env import expand_nodelist, tasks_per_node
from phalanx.errors import UserError
from phalanx.launch.agent import threads_per_rank


def test_plain_python_is_a_world_of_one():
    env = detect_launch_env({})
    assert (env.rank, env.world_size, env.launcher) == (0, 1, "none")
    assert not under_launcher({})


def test_torchrun_variables():
    e = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
         "TORCHELASTIC_RUN_ID": "x"}
    env = detect_launch_env(e)
    assert (env.rank, env.local_rank, env.world_size, env.launcher) == (3, 1, 4, "torchrun")
    assert under_launcher(e)


def test_slurm_variables():
    e = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0",
         "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1", "MASTER_ADDR": "10.0.0.1",
         "MASTER_PORT": "1234"}
    env = detect_launch_env(e)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.launcher) == \
        (5, 1, 8, 4, "slurm")
    assert env.rendezvous == () and under_launcher(e)


def test_srun_without_master_addr_is_a_worker_meeting_on_the_first_host():
    """The measured defect: srun sets no MASTER_ADDR, and each task became a launcher."""
    e = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "3",
         "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "4242", "SLURM_STEP_TASKS_PER_NODE": "2,1",
         "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "gpu[07-08]"}
    assert under_launcher(e)
    env = detect_launch_env(e)
    assert (env.rank, env.world_size, env.local_world_size) == (1, 3, 2)
    meet = dict(env.rendezvous)
    assert meet["MASTER_ADDR"] == "gpu07" and 20000 <= int(meet["MASTER_PORT"]) < 40000
    assert meet == dict(detect_launch_env({**e, "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
                                           "SLURM_NODEID": "1"}).rendezvous)


def test_the_batch_script_is_not_a_task():
    assert not under_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "1"})


def test_torchrun_inside_srun_wins():
    e = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0", "RANK": "3",
         "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
         "TORCHELASTIC_RUN_ID": "x"}
    assert detect_launch_env(e).launcher == "torchrun"


@pytest.mark.parametrize("nodelist, hosts", [
    ("node1", ["node1"]),
    ("node[01-03,7],gpu5", ["node01", "node02", "node03", "node7", "gpu5"]),
    ("a[1-2]-ib,b", ["a1-ib", "a2-ib", "b"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
])
def test_nodelists_expand_as_scontrol_does(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node]1", "node[a-b]", "node[3-1]", ""])
def test_a_malformed_nodelist_is_one_line(bad):
    with pytest.raises(UserError, match="SLURM node list"):
        expand_nodelist(bad)


def test_tasks_per_node():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(UserError, match="malformed"):
        tasks_per_node("two")


def test_inconsistent_ranks_are_refused():
    with pytest.raises(UserError, match="RANK=4.*WORLD_SIZE=4"):
        detect_launch_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(UserError, match="`RANK` is `x`, expected an integer"):
        detect_launch_env({"RANK": "x", "WORLD_SIZE": "4"})


def test_threads_split_the_cores():
    assert threads_per_rank(10_000, None) == 1
    assert threads_per_rank(2, 3) == 3

