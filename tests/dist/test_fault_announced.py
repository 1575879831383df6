"""PHALANX_FAULT is never silent (issue 41.6): `phalanx.init` refuses a malformed value
before anything starts, as `phalanx train` does, and a set one is said in one line,
recorded in environment.json under "PHALANX_FAULT" and in the events."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

import phalanx
from phalanx.cluster import protocol
from phalanx.errors import UserError
from phalanx.report.events import read_events

NEVER = "rank=0,step=999999,phase=step,action=raise"  # valid, and never reached here


@pytest.fixture(autouse=True)
def unannounced(monkeypatch):
    monkeypatch.delenv(protocol.FAULT_ANNOUNCED, raising=False)


def test_init_refuses_a_malformed_value_before_anything(tmp_path, monkeypatch):
    monkeypatch.setenv(protocol.FAULT, "rank=0,step=1,action=explode")
    with pytest.raises(UserError, match="PHALANX_FAULT=`rank=0,step=1,action=explode` is "
                                        "malformed"):
        phalanx.init(out=tmp_path / "run")
    assert not dist.is_initialized() and not (tmp_path / "run").exists()


def test_a_set_value_is_said_recorded_and_in_the_events(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(protocol.FAULT, NEVER)
    with phalanx.init(out=tmp_path) as run:
        assert run.world_size == 1
    said = [ln for ln in capsys.readouterr().out.splitlines() if "PHALANX_FAULT" in ln]
    assert said == [f"phalanx: PHALANX_FAULT is set (fault injection): {NEVER}"], said
    env = json.loads((tmp_path / "environment.json").read_text())
    assert env["PHALANX_FAULT"] == NEVER, env
    events = [e for e in read_events(tmp_path) if e["kind"] == "fault"]
    assert len(events) == 1 and NEVER in events[0]["message"], events


def test_unset_leaves_no_trace(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(protocol.FAULT, raising=False)
    with phalanx.init(out=tmp_path):
        pass
    assert "PHALANX_FAULT" not in capsys.readouterr().out
    assert "PHALANX_FAULT" not in json.loads((tmp_path / "environment.json").read_text())
    assert not [e for e in read_events(tmp_path) if e["kind"] == "fault"]
