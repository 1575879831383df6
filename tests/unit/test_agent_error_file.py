"""A worker's error record for torch's elastic agent (`protocol.record_for_agent`) appears
whole or not at all: torch writes it in place, and a signal in the middle (the agent
stopping the ranks after a peer died) left a torn file that crashed the launcher with a
JSONDecodeError traceback (seen once in the chaos test)."""

from __future__ import annotations

import json
import os

import pytest

from phalanx.cluster import protocol


def test_a_record_cut_short_leaves_no_torn_file(tmp_path, monkeypatch):
    from torch.distributed.elastic.multiprocessing.errors import error_handler

    real = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(real))

    def cut(data, fp):  # SIGTERM's KeyboardInterrupt arriving inside json.dump
        fp.write("{")
        fp.flush()
        raise KeyboardInterrupt

    monkeypatch.setattr(error_handler.json, "dump", cut)
    with pytest.raises(KeyboardInterrupt):
        protocol.record_for_agent(ValueError("bad batch"))
    assert not real.exists(), real.read_text()  # before: a file holding "{"
    assert os.listdir(tmp_path) == []
    assert os.environ["TORCHELASTIC_ERROR_FILE"] == str(real)


def test_a_whole_record_is_where_the_agent_reads_it(tmp_path, monkeypatch):
    real = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(real))
    monkeypatch.delenv(protocol.LAUNCHED, raising=False)
    assert protocol.record_for_agent(ValueError("bad batch")) is False  # not Phalanx's rank
    assert json.loads(real.read_text())["message"]["message"] == "ValueError: bad batch"
    assert os.listdir(tmp_path) == ["error.json"]
