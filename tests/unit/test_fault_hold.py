"""PHALANX_FAULT's action=hold: the rank waits at its point until the release file exists
(the tests' way to act on a run known to be mid-run), and is refused without one."""

from __future__ import annotations

import threading
import time

import pytest

from phalanx.cluster import faults
from phalanx.errors import UserError


def test_a_hold_without_a_release_file_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("PHALANX_FAULT", "rank=0,step=3,action=hold")
    monkeypatch.delenv("PHALANX_FAULT_RELEASE", raising=False)
    with pytest.raises(UserError, match="PHALANX_FAULT_RELEASE is not set"):
        faults.check_faults()


def test_a_hold_waits_for_its_release_file_and_only_at_its_step(monkeypatch, tmp_path, capsys):
    release = tmp_path / "release"
    monkeypatch.setenv("PHALANX_FAULT", "rank=0,step=3,action=hold")
    monkeypatch.setenv("PHALANX_FAULT_RELEASE", str(release))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(faults, "_FIRED", {})
    faults.check_faults()
    began = time.monotonic()
    threading.Timer(1.0, release.touch).start()
    faults.fault_point("step", 2)  # another step: no hold
    assert not release.exists(), "held at step 2"
    faults.fault_point("step", 3)
    assert time.monotonic() - began >= 0.95 and release.exists()
    assert "phalanx-fault: hold at step 3" in capsys.readouterr().err
