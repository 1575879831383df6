"""Issue 48: `--tracker mlflow` against a real MLflow tracking server that the test starts
on loopback with a SQLite store. A 2-rank run logs its records and params to one MLflow
run, written by rank 0; its resume continues the same run (a setting changed on resume
goes in as a tag); the server stopped mid-run costs one warning, the run goes on and
metrics.jsonl keeps every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_profile_steps import TINY

from mlflow_server import Server

mlflow = pytest.importorskip("mlflow", reason="the trackers extra (mlflow) is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = Server(tmp_path_factory.mktemp("mlflow"))
    yield running
    running.stop()


def train(out: Path, corpus_file, cache_dir, uri: str, *args: str,
          **popen) -> subprocess.Popen | subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_EXPERIMENT_NAME": "phalanx-test",
           **popen.pop("env", {})}
    argv = [sys.executable, "-m", "phalanx", "train", *TINY, "--tracker", "mlflow", "--data",
            str(corpus_file), "--cache-dir", str(cache_dir), "--out", str(out), *args]
    if popen.pop("background", False):
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)


def losses(out: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def test_a_two_rank_run_and_its_resume_log_to_one_mlflow_run(server, tmp_path, corpus_file,
                                                            cache_dir):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "run"
    done = train(out, corpus_file, cache_dir, server.uri, "--max-steps", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stdout + done.stderr
    client = MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("phalanx-test")
    [run] = client.search_runs([experiment.experiment_id])
    assert json.loads((out / "trackers.json").read_text())["mlflow"]["run_id"] == run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["run_config.train.max_steps"] == "4"
    assert "environment.torch" in run.data.params or any(
        k.startswith("environment.") for k in run.data.params)

    def logged() -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in sorted(client.get_metric_history(
            run.info.run_id, "loss"), key=lambda m: m.step)]

    assert logged() == losses(out)  # every record rank 0 logged, once, as float64
    done = train(out, corpus_file, cache_dir, server.uri, "--max-steps", "6")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed from" in done.stdout + done.stderr
    [again] = client.search_runs([experiment.experiment_id])  # the same run, continued
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    assert again.data.params["run_config.train.max_steps"] == "4"  # MLflow keeps the first
    assert again.data.tags["resumed.run_config.train.max_steps"] == "6"
    assert logged() == losses(out) and [s for s, _ in logged()] == list(range(1, 7))


def test_the_server_stopped_mid_run_costs_one_warning(server, tmp_path, corpus_file,
                                                      cache_dir):
    """Last in this file: it stops the module's server (one start, ~10-30 s, saved)."""
    alone = server
    out = tmp_path / "run"
    try:
        proc = train(out, corpus_file, cache_dir, alone.uri, "--max-steps", "40",
                     background=True, env={"PHALANX_TRACKER_STALL_S": "3"})
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").exists() or len(losses(out)) < 5:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        alone.stop()  # mid-run
        stopped = time.monotonic()
        stdout, stderr = proc.communicate(timeout=300)
        after = time.monotonic() - stopped
    finally:
        alone.stop()
    said = stdout + stderr
    assert proc.returncode == 0, said
    warnings = [line for line in said.splitlines() if "tracker mlflow" in line]
    # one warning: at the first record after 3 s without an answer, or at the end when the
    # run finished sooner; either way not MLflow's minutes of retries
    assert len(warnings) == 1 and "no answer from the MLflow tracking server in 3 s" in \
        warnings[0], warnings
    assert after < 90, after
    assert [s for s, _ in losses(out)] == list(range(1, 41))  # nothing lost there
