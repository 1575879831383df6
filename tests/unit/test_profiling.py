"""The step profiler (runtime.profiling) at one rank, in this process: which steps it
profiles (a run resumed inside the range profiles what is left), what it writes, and
`run.profile()` in a script. The 2-rank trainer run is tests/e2e/test_profile_steps.py."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from torch.profiler import record_function

import phalanx
from phalanx.config.fields import step_range
from phalanx.errors import UserError
from phalanx.report.profile_table import profile_section
from phalanx.runtime.profiling import StepProfiler


def work() -> None:
    with record_function("phalanx::forward"):
        torch.randn(64, 64) @ torch.randn(64, 64)


def test_a_run_resumed_inside_the_range_profiles_the_steps_left(tmp_path):
    with phalanx.init(seed=0, threads=1) as run:
        prof = StepProfiler(run, (5, 7), tmp_path, done=5, end=100)  # resumed after step 5
        for done in (6, 7, 8):
            work()
            prof.after(done)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == [6, 7] and len(summary["ranks"]) == 1
    assert summary["ranks"][0]["phases_ms"]["forward"] > 0
    trace = json.loads(gzip.decompress((tmp_path / "rank-0.json.gz").read_bytes()))
    assert any(e.get("name") == "phalanx::forward" for e in trace["traceEvents"])


def test_a_run_that_ends_inside_the_range_writes_what_it_profiled(tmp_path):
    with phalanx.init(seed=0, threads=1) as run:
        prof = StepProfiler(run, (2, 9), tmp_path, done=0, end=3)  # --max-steps 3
        for done in (1, 2, 3):
            work()
            prof.after(done)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == [2, 3]


def test_nothing_is_written_outside_the_range(tmp_path):
    with phalanx.init(seed=0, threads=1) as run:
        prof = StepProfiler(run, (5, 7), tmp_path / "p", done=8, end=100)  # resumed past it
        prof.after(9)
    assert not (tmp_path / "p").exists()


def test_run_profile_in_a_script_and_the_report_section(tmp_path):
    with phalanx.init(seed=0, threads=1, out=tmp_path) as run:
        with run.profile():
            work()
    html = profile_section(tmp_path / "profile", print)
    assert "<td>0</td>" in html and "the block" in html and "profile/rank-0.json.gz" in html
    (tmp_path / "profile" / "summary.json").write_text('{"ranks": [{"wall_ms": "x"}]}')
    assert "–" in profile_section(tmp_path / "profile", print)  # not trusted: a dash


@pytest.mark.parametrize("text", ["7-5", "0-3", "a-b", "5-", "-3"])
def test_a_bad_range_is_refused_naming_the_flag(text):
    with pytest.raises(UserError, match=f"`--profile-steps {text}` must be A-B"):
        step_range(text, "--profile-steps")
    assert step_range("5-7", "--profile-steps") == (5, 7) and step_range("4", "x") == (4, 4)


def test_a_run_stopped_inside_the_range_writes_what_it_profiled(tmp_path):
    with phalanx.init(seed=0, threads=1) as run:
        prof = StepProfiler(run, (5, 9), tmp_path, done=4, end=100)
        for done in (5, 6):
            work()
            prof.after(done)
        prof.close(6)  # the loop stopped after step 6 (a stop signal)
        prof.abandon()  # (train's finally: nothing left to stop)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == [5, 6]
