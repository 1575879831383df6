"""Under a plain `srun` (what `phalanx slurm` writes) WORLD_SIZE is unset: the DDP
options a user gives must still reach DDP (issue 25, section 3: `srun -N1 -n2 phalanx
train --bucket-cap-mb 1 --find-unused-parameters --no-gradient-as-bucket-view` built
DDP with 25.0 / False / True)."""

from __future__ import annotations

from phalanx.cli import build_parser, parse
from phalanx.config.flags import resolve
from phalanx.train.worker import strategy_options

SRUN = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29511"}


def test_ddp_options_reach_ddp_under_plain_srun(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in SRUN.items():
        monkeypatch.setenv(name, value)
    argv = ["train", "--bucket-cap-mb", "1", "--find-unused-parameters",
            "--no-gradient-as-bucket-view"]
    options = strategy_options(resolve(parse(build_parser(), argv)))
    assert options["bucket_cap_mb"] == 1.0
    assert options["find_unused_parameters"] is True
    assert options["gradient_as_bucket_view"] is False
