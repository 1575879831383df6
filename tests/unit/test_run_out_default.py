"""`phalanx run` as one rank under torchrun/srun without `--out`: the run directory is
named after the job, the same on every rank — and refused where there is no job name."""

from __future__ import annotations

import pytest

from phalanx.errors import UserError
from phalanx.launch.script_run import _job_out


def test_named_after_the_slurm_job_and_step(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "812")
    monkeypatch.setenv("SLURM_STEP_ID", "3")
    assert _job_out("run") == "runs/run-slurm-812.3"


def test_named_after_torchruns_run_id(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job/7")
    assert _job_out("run") == "runs/run-job_7"


@pytest.mark.parametrize("run_id", ["none", ""])
def test_no_job_name_is_refused_not_shared(monkeypatch, run_id):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
    with pytest.raises(UserError, match="Give `--out DIR`"):
        _job_out("run")
