"""The MLflow tracker's background queue (report.mlflow_tracker), with MLflow's client
replaced by one that records or blocks: a request that hangs never stalls `log`, and is
named in one warning once it is STALL_S old; a resumed run continues the MLflow run and
does not send replayed steps; a setting changed on resume becomes a tag. (The real
server: tests/e2e/test_mlflow.py.)"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("mlflow", reason="the trackers extra (mlflow) is not installed")
import mlflow.tracking  # noqa: E402

from phalanx.report import mlflow_tracker  # noqa: E402
from phalanx.report.mlflow_tracker import MlflowTracker, flat  # noqa: E402
from phalanx.report.trackers import Tracking  # noqa: E402


class Client:
    """MLflow's client, answering from memory; `hold` blocks every log_batch."""

    runs: dict[str, SimpleNamespace] = {}
    hold = threading.Event()
    holding = False

    def __init__(self, *args) -> None:
        pass

    def get_experiment_by_name(self, name):
        return None

    def create_experiment(self, name):
        return "1"

    def create_run(self, experiment_id, run_name=None):
        run = SimpleNamespace(info=SimpleNamespace(run_id=f"r{len(self.runs)}"),
                              data=SimpleNamespace(params={}), metrics=[], tags={},
                              status="RUNNING")
        self.runs[run.info.run_id] = run
        return run

    def get_run(self, run_id):
        return self.runs[run_id]

    def update_run(self, run_id, status):
        self.runs[run_id].status = status

    def set_terminated(self, run_id):
        self.runs[run_id].status = "FINISHED"

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        if Client.holding:
            Client.hold.wait(30)
        run = self.runs[run_id]
        run.metrics += [(m.step, m.key, m.value) for m in metrics]
        run.data.params.update({p.key: p.value for p in params})
        run.tags.update({t.key: t.value for t in tags})


@pytest.fixture
def client(monkeypatch):
    Client.runs, Client.holding = {}, False
    Client.hold = threading.Event()
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", Client)
    monkeypatch.setattr(mlflow_tracker, "STALL_S", 0.5)
    yield Client
    Client.hold.set()


def _config(out: Path, max_steps: int) -> None:
    out.mkdir(exist_ok=True)
    (out / "run_config.json").write_text(json.dumps({"train": {"max_steps": max_steps}}))


def test_records_params_and_a_resume_that_replays_steps(client, tmp_path: Path):
    said: list[str] = []
    _config(tmp_path, 4)
    tracker = MlflowTracker(tmp_path, said.append)
    for step in (1, 2, 3):
        tracker.log({"step": step, "loss": 1.0 / step, "note": "text is not a metric"})
    tracker.close()
    [run] = client.runs.values()
    assert run.metrics == [(1, "loss", 1.0), (2, "loss", 0.5), (3, "loss", 1.0 / 3)]
    assert run.data.params == {"run_config.train.max_steps": "4"} and run.status == "FINISHED"
    kept = json.loads((tmp_path / "trackers.json").read_text())["mlflow"]
    assert kept == {"run_id": run.info.run_id, "last_step": 3}
    _config(tmp_path, 6)  # resumed from step 1 with another max_steps
    tracking = Tracking(("mlflow",), tmp_path, said.append)  # which skips replayed steps
    for step in (2, 3, 4):
        tracking.log({"step": step, "loss": 9.0})
    tracking.close()
    assert list(client.runs) == [run.info.run_id]  # the same MLflow run, continued
    assert run.metrics[-1] == (4, "loss", 9.0) and len(run.metrics) == 4  # 2, 3: not again
    assert run.tags == {"resumed.run_config.train.max_steps": "6"}
    assert run.data.params == {"run_config.train.max_steps": "4"}
    assert said == ["phalanx: note: MLflow keeps the steps it was sent before; steps below 4 "
                    "trained again after this resume are not sent to it again (metrics.jsonl "
                    "has them)."]


def test_a_hanging_server_is_one_warning_and_never_a_stalled_step(client, tmp_path: Path):
    said: list[str] = []
    tracking = Tracking(("mlflow",), tmp_path, said.append)
    client.holding = True  # every request hangs (MLflow's retries)
    slowest = 0.0
    for step in range(1, 40):
        started = time.monotonic()
        tracking.log({"step": step, "loss": 1.0})
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.05)
    tracking.close()
    assert slowest < 0.1, slowest  # `log` only enqueues
    assert len(said) == 1, said  # at the first record after 0.5 s without an answer
    assert said[0].startswith("phalanx: warning: tracker mlflow failed to log step ") and \
        "(TimeoutError: no answer from the MLflow tracking server in 0.5 s); it is dropped " \
        "for the rest of this run" in said[0], said


def test_params_are_flat_text_within_mlflows_limit():
    assert flat({"a": {"b": 1, "c": [1, 2]}, "d": "x" * 7000}) == {
        "a.b": "1", "a.c": "[1, 2]", "d": "x" * 6000}
