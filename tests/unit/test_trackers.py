"""Issue 48: experiment trackers. W&B offline, checked by reading the run file it writes
(its transaction log: a LevelDB-style log of protobuf records, read below with W&B's own
protobuf classes); a tracker that fails warns once and the run goes on; bad names and a
missing package are one-line errors."""

from __future__ import annotations

import json

import pytest

import phalanx
from phalanx.config.fields import tracker_list
from phalanx.errors import UserError

wandb = pytest.importorskip("wandb", reason="the trackers extra (wandb) is not installed")
from wandb_files import history  # noqa: E402 - (tests/: needs wandb)


@pytest.fixture(scope="module", autouse=True)
def _service_ended():
    """W&B's service process ended with this file (else its atexit hook, at the worker's
    exit, finds the connection gone and prints a traceback)."""
    yield
    wandb.teardown()


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("PHALANX_TRACKERS", raising=False)
    return tmp_path / "run"


def test_wandb_offline_holds_what_run_log_wrote(offline, capsys):
    with phalanx.init(seed=0, threads=1, out=offline, trackers="wandb") as run:
        for step in (1, 2, 3):
            run.log(step, reduce=None, loss=1.0 / step, tokens=64)
    rows = history(offline)
    assert [(r["_step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 0.5), (3, 1.0 / 3)]
    assert all("memory_mib" in r for r in rows)  # what the sink measured goes too
    assert "tokens_per_s" in rows[-1]
    kept = json.loads((offline / "trackers.json").read_text())["wandb"]
    assert kept["mode"] == "offline" and kept["id"]
    # the same run directory again: an offline W&B run cannot be resumed, said in one line
    with phalanx.init(seed=0, threads=1, out=offline, trackers=["wandb"]) as run:
        run.log(4, reduce=None, loss=0.25)
    said = capsys.readouterr().out
    assert said.count("W&B offline runs cannot be resumed: this attempt logs to a new "
                      f"offline run beside {kept['id']}") == 1
    assert len(list(offline.glob("wandb/offline-run-*"))) == 2


def test_a_tracker_that_fails_warns_once_and_the_run_goes_on(offline, monkeypatch, capsys):
    calls = []

    def broken(self, values, step=None, **kw):
        calls.append(step)
        raise ConnectionError("server unreachable\nmore detail")

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", broken)
    with phalanx.init(seed=0, threads=1, out=offline, trackers="wandb") as run:
        for step in (1, 2, 3):
            run.log(step, reduce=None, loss=float(step))
    out = capsys.readouterr().out
    assert out.count("phalanx: warning: tracker wandb failed to log step 1 (ConnectionError: "
                     "server unreachable); it is dropped for the rest of this run") == 1
    assert calls == [1]  # dropped after the first failure
    assert wandb.run is None  # and its W&B run ended with the Phalanx run (not left open)
    lines = (offline / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_a_tracker_that_cannot_start_is_said_once(offline, monkeypatch, capsys):
    def refuse(**kw):
        raise RuntimeError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", refuse)
    with phalanx.init(seed=0, threads=1, out=offline, trackers="wandb") as run:
        run.log(1, reduce=None, loss=1.0)
        run.log(2, reduce=None, loss=2.0)
    out = capsys.readouterr().out
    assert out.count("tracker wandb could not start (RuntimeError: api_key not configured "
                     "(no-tty)); training goes on without it") == 1
    assert len((offline / "metrics.jsonl").read_text().splitlines()) == 2


def test_bad_tracker_names_are_one_line(monkeypatch):
    assert tracker_list("WandB, wandb") == ("wandb",) and tracker_list(None) == ()
    assert tracker_list("wandb,MLflow") == ("wandb", "mlflow")
    with pytest.raises(UserError, match=r"tracker `comet` is not supported; supported: "
                                        r"wandb, mlflow \(TensorBoard"):
        tracker_list("wandb,comet")
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"needs the wandb package, which is not installed: "
                                        r"pip install 'phalanx\[trackers\]'"):
        tracker_list("wandb")
