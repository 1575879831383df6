"""The job file (`phalanx.launch.job`): what a launcher decided, read back equal; a file
from another Phalanx, a layout not built, a link or no file: one line each."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from phalanx.cli import dispatch
from phalanx.cluster import protocol
from phalanx.config.sections import build_config
from phalanx.errors import UserError
from phalanx.launch import job as jobs


def _job(tmp_path: Path, **layout) -> jobs.Job:
    cfg = build_config({"train": {"max_steps": 7}, "dist": {"strategy": "fsdp", **layout}})
    return jobs.Job("train", cfg, tmp_path.absolute(), ("--max-steps", "7"),
                    "/runs/a/checkpoints/step-00000007|abc")


def test_a_written_job_reads_back_equal(tmp_path):
    job = _job(tmp_path, dp_replicate=2)
    path = jobs.write(job)
    assert path == tmp_path / "job.json"
    assert jobs.load(path) == job
    assert jobs.load(path).layout == {"pp": None, "dp_replicate": 2, "dp_shard": None,
                                      "tp": None}


def test_a_job_from_another_phalanx_is_refused_in_one_line(tmp_path):
    path = jobs.write(_job(tmp_path))
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "phalanx": "0.0.1"}))
    with pytest.raises(UserError, match=r"written by Phalanx 0\.0\.1, not by this Phalanx") as e:
        jobs.load(path)
    assert "\n" not in str(e.value)
    path.write_text(json.dumps({**data, "format": jobs.FORMAT + 1}))
    with pytest.raises(UserError, match=f"job format {jobs.FORMAT}"):
        jobs.load(path)


def test_a_layout_the_schedules_would_refuse_is_refused_first(tmp_path):
    with pytest.raises(UserError, match=r"`--pp 2`: 1 micro-batch\(es\) leave 2 pipeline ranks "
                                        r"idle .*: pass --grad-accum 2 or more\.$"):
        _job(tmp_path, pp=2)
    with pytest.raises(UserError, match="`--pp` must be a whole number >= 1, or -1"):
        _job(tmp_path, pp=0)
    assert not (tmp_path / "job.json").exists()


def test_a_link_or_no_file_is_refused(tmp_path):
    (tmp_path / "real.json").write_text(_job(tmp_path).to_json())
    os.symlink(tmp_path / "real.json", tmp_path / "job.json")
    with pytest.raises(UserError, match="link"):
        jobs.load(tmp_path / "job.json")
    with pytest.raises(UserError, match="does not exist"):
        jobs.load(tmp_path / "none.json")


def test_only_a_phalanx_worker_is_handed_a_job(tmp_path):
    path = str(jobs.write(_job(tmp_path)))
    assert jobs.handed_job({protocol.JOB: path}) is None  # not a worker of Phalanx's launcher
    assert jobs.handed_job({protocol.JOB: path, protocol.LAUNCHED: "1"}) == _job(tmp_path)


def test_a_worker_handed_another_versions_job_exits_2_in_one_line(tmp_path, monkeypatch,
                                                                 capsys):
    path = jobs.write(_job(tmp_path))
    path.write_text(path.read_text().replace(f'"phalanx": "{jobs.__version__}"',
                                             '"phalanx": "9.9"'))
    monkeypatch.setenv(protocol.JOB, str(path))
    monkeypatch.setenv(protocol.LAUNCHED, "1")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setattr(dispatch, "quiet_worker", lambda: None)
    assert dispatch.main(["train", "--max-steps", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "written by Phalanx 9.9" in err[0], err
