"""Launcher detection from environment variables alone."""

from __future__ import annotations

import pytest

from phalanx.envinfo import detect_launch_env, under_launcher
from phalanx.errors import UserError
from phalanx.launch import threads_per_rank


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


def test_slurm_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    e = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8",
         "SLURM_NTASKS_PER_NODE": "4", "MASTER_ADDR": "10.0.0.1"}
    env = detect_launch_env(e)
    assert (env.rank, env.local_rank, env.world_size, env.launcher) == (5, 1, 8, "slurm")


def test_inconsistent_ranks_are_refused():
    with pytest.raises(UserError, match="RANK=4.*WORLD_SIZE=4"):
        detect_launch_env({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(UserError, match="`RANK` is `x`, expected an integer"):
        detect_launch_env({"RANK": "x", "WORLD_SIZE": "4"})


def test_threads_split_the_cores():
    assert threads_per_rank(10_000, None) == 1
    assert threads_per_rank(2, 3) == 3

