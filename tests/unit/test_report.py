"""Rank-0 progress output."""

from __future__ import annotations


def test_progress_bar_on_a_terminal_and_lines_elsewhere(capsys):
    from phalanx.report.progress import ProgressReporter

    plain = ProgressReporter(10, live=False)
    plain.update(5, 2.5, 1000.0, 1e-3)
    assert "step 5/10 | loss 2.5000 | 1,000 tok/s | lr 1.00e-03 | eta" in capsys.readouterr().out
    live = ProgressReporter(10, live=True)
    live.update(10, 1.25, 2000.0, 1e-4)
    live.close()
    assert "loss 1.2500" in capsys.readouterr().out
