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

# The resume runs STEPS steps (no evaluation); rank 0 holds after step 8 until the test,
# having seen steps 5 and 6 reach the server, stopped it mid-run and let the run go on
# (100 plain steps once ended before a loaded CI's polls saw step 6; a fixed slow-down
# only makes such a window likely, the hold makes it certain).
STEPS, HOLD = 40, "rank=0,step=8,phase=step,action=hold"


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
    text = (out / "metrics.jsonl").read_text()
    lines = text.splitlines()[:None if text.endswith("\n") else -1]  # (one being written)
    rows = [json.loads(line) for line in lines]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def test_a_two_rank_run_and_its_resume_log_to_one_mlflow_run_until_the_server_goes(
        tmp_path, corpus_file, cache_dir):
    """One server, two legs (the second ~30 s of CI): 4 steps logged and finished;
    the resume to STEPS steps continues the same MLflow run; then the server is stopped
    mid-run: one warning, no stall, metrics.jsonl complete."""
    from mlflow.tracking import MlflowClient

    server, proc, release = Server(tmp_path / "mlflow"), None, tmp_path / "release"
    try:
        client, out = MlflowClient(server.uri), tmp_path / "run"
        run_id = _first_leg(server, client, out, corpus_file, cache_dir)
        proc = train(out, corpus_file, cache_dir, server.uri, "--max-steps", str(STEPS),
                     "--eval-every", "0", background=True,
                     env={"PHALANX_TRACKER_STALL_S": "3", "PHALANX_FAULT": HOLD,
                          "PHALANX_FAULT_RELEASE": str(release)})
        seen = _continued(client, run_id, proc)
        server.stop()  # mid-run: at once, before anything else is asked of it
        stopped = time.monotonic()
        assert proc.poll() is None, "the run ended before the server was stopped"
        release.touch()
        stdout, stderr = proc.communicate(timeout=300)
        after = time.monotonic() - stopped
    finally:
        server.stop()
        release.touch()  # (a failure before it: no rank left holding)
        if proc is not None and proc.poll() is None:
            proc.kill()
    _same_run(seen, run_id, losses(out))
    said = stdout + stderr
    assert proc.returncode == 0 and "resumed from" in said, said
    warnings = [line for line in said.splitlines() if "tracker mlflow" in line]
    # one warning: at the first record after 3 s without an answer, or at the end when the
    # run finished sooner; either way not MLflow's minutes of retries
    # (a server killed mid-answer may instead leave a truncated response: a failed log)
    assert len(warnings) == 1 and ("no answer from the MLflow tracking server in 3 s" in
                                   warnings[0] or "failed to log step" in warnings[0]), warnings
    assert after < 90, after
    assert [s for s, _ in losses(out)] == list(range(1, STEPS + 1))  # nothing lost there


def _logged(client, run_id: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, "loss"),
                                              key=lambda m: m.step)]


def _first_leg(server, client, out: Path, corpus_file, cache_dir) -> str:
    """4 steps: one FINISHED run holding every record rank 0 logged, and the params."""
    done = train(out, corpus_file, cache_dir, server.uri, "--max-steps", "4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warning" not in done.stdout + done.stderr
    experiment = client.get_experiment_by_name("phalanx-test")
    [run] = client.search_runs([experiment.experiment_id])
    assert json.loads((out / "trackers.json").read_text())["mlflow"]["run_id"] == run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["run_config.train.max_steps"] == "4"
    assert any(k.startswith("environment.") for k in run.data.params)
    assert _logged(client, run.info.run_id) == losses(out)  # once each, as float64
    return run.info.run_id


def _continued(client, run_id: str, proc: subprocess.Popen) -> dict:
    """What the server holds once the resume has logged steps 5 and 6 (asked each poll,
    so that the server can be stopped the moment they are there): the runs of the
    experiment, the run, its loss history."""
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        experiment = client.get_experiment_by_name("phalanx-test")
        seen = {"runs": client.search_runs([experiment.experiment_id]),
                "run": client.get_run(run_id), "logged": _logged(client, run_id)}
        if len(seen["logged"]) >= 6:
            return seen
        time.sleep(0.2)


def _same_run(seen: dict, run_id: str, mine: list[tuple[int, float]]) -> None:
    """The resume logged to the same MLflow run: no second run, steps 5, 6 after 1-4 as
    metrics.jsonl has them, the changed setting a tag (MLflow refuses a changed param)."""
    assert [r.info.run_id for r in seen["runs"]] == [run_id]
    again = seen["run"]
    assert again.data.params["run_config.train.max_steps"] == "4"  # MLflow keeps the first
    assert again.data.tags["resumed.run_config.train.max_steps"] == str(STEPS)
    logged = seen["logged"]
    assert [s for s, _ in logged] == list(range(1, len(logged) + 1))
    assert logged == mine[:len(logged)]
