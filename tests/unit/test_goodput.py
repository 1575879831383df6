"""Issue 45: goodput — the share of wall time inside optimizer steps that were kept — for
every run, read from the ledger rank 0 keeps (`OUT/goodput.jsonl`, report.goodput)."""

from __future__ import annotations

import json

import pytest

from phalanx.report.goodput import FILE, Ledger, summarise


def _ledger(out, *records):
    (out / FILE).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_one_segment_is_its_steps_over_its_wall(tmp_path):
    _ledger(tmp_path, {"kind": "start", "step": 0, "time": 110.0, "launched": 100.0},
            {"kind": "at", "step": 10, "busy": 20.0, "time": 135.0},
            {"kind": "end", "step": 20, "busy": 40.0, "time": 160.0})
    good = summarise(tmp_path)
    assert good is not None
    assert (good.wall_s, good.productive_s, good.startup_s, good.recomputed_s) == \
        (60.0, 40.0, 10.0, 0.0)
    assert good.share == pytest.approx(2 / 3)
    assert good.line().startswith("goodput 67%: 40.0 s of 60.0 s wall") and \
        "and waits 10.0 s (1 segment)" in good.line()


def test_steps_after_the_checkpoint_resumed_from_are_recomputed(tmp_path):
    """A crash after step 15: the next attempt resumed from the checkpoint of step 10, so
    steps 11–15 were taken twice: the first time is lost."""
    _ledger(tmp_path, {"kind": "start", "step": 0, "time": 102.0, "launched": 100.0},
            {"kind": "saved", "step": 10, "busy": 10.0, "time": 113.0},
            {"kind": "at", "step": 15, "busy": 15.0, "time": 118.0},
            # (killed: no end record) — the agent restarts it
            {"kind": "start", "step": 10, "time": 124.0, "launched": 118.0},
            {"kind": "end", "step": 20, "busy": 10.0, "time": 135.0})
    good = summarise(tmp_path)
    assert good is not None and good.segments == 2
    assert (good.wall_s, good.productive_s, good.startup_s, good.recomputed_s) == \
        (35.0, 20.0, 8.0, 5.0)


def test_a_rollback_or_a_heal_starts_a_segment_without_a_launch(tmp_path):
    _ledger(tmp_path, {"kind": "start", "step": 0, "time": 100.0, "launched": 100.0},
            {"kind": "saved", "step": 4, "busy": 4.0, "time": 104.0},
            {"kind": "at", "step": 6, "busy": 6.0, "time": 106.0},
            {"kind": "start", "step": 4, "time": 107.0},  # rolled back to step 4
            {"kind": "end", "step": 10, "busy": 6.0, "time": 113.0})
    good = summarise(tmp_path)
    assert good is not None
    assert (good.wall_s, good.productive_s, good.recomputed_s) == (12.0, 10.0, 2.0)
    _ledger(tmp_path, {"kind": "start", "step": 3, "time": 100.0, "launched": 100.0},
            {"kind": "at", "step": 3, "busy": 0.0, "time": 105.0},  # quorum, then healed
            {"kind": "start", "step": 8, "time": 105.0},  # to the live groups' step 8
            {"kind": "end", "step": 10, "busy": 2.0, "time": 107.0})
    good = summarise(tmp_path)
    assert good is not None and (good.wall_s, good.productive_s) == (7.0, 2.0)


def test_a_torn_line_is_skipped_and_said(tmp_path):
    said: list[str] = []
    (tmp_path / FILE).write_text(
        json.dumps({"kind": "start", "step": 0, "time": 1.0, "launched": 0.0}) + "\n"
        + json.dumps({"kind": "end", "step": 2, "busy": 0.5, "time": 2.0}) + "\n"
        + '{"kind": "at", "st')
    good = summarise(tmp_path, said.append)
    assert good is not None and good.productive_s == 0.5 and len(said) == 1
    assert summarise(tmp_path / "nothing") is None


def test_only_rank_0_writes_and_a_restart_counts_from_the_last_record(tmp_path):
    Ledger(tmp_path, writes=False).start(0)
    assert not (tmp_path / FILE).exists()
    first = Ledger(tmp_path, writes=True)
    first.start(0)
    first.stepped(0.25)
    first.reached(1, "saved")
    again = Ledger(tmp_path, writes=True)  # the agent's restart: the same launcher
    again.start(1)
    records = [json.loads(line) for line in (tmp_path / FILE).read_text().splitlines()]
    assert [r["kind"] for r in records] == ["start", "saved", "start"]
    assert records[1]["busy"] == 0.25
    assert records[2]["launched"] >= records[1]["time"]  # not the launcher's own start
