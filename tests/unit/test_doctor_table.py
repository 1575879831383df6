"""`phalanx doctor`'s table follows the terminal's width and shows no empty `fix` column."""

from __future__ import annotations

import pytest

from phalanx.doctor.checks import Check, render_table

PASSING = [Check("environment", "torch", "pass", "2.13.0 with gloo " + "x" * 80, ""),
           Check("collectives", "all_reduce", "pass", "sum 3 (expected 3)", "")]
FAILING = PASSING + [Check("performance", "compute speed per rank", "fail",
                           "slowest/fastest = 1.6", "rank 1 is a straggler: check its threads")]


@pytest.mark.parametrize("columns", [72, 100, 160])
def test_the_table_fits_the_terminal(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    text = render_table(FAILING, [])
    assert max(len(line) for line in text.splitlines()) <= columns
    assert "straggler" in text.replace("\n", " ") or "stragg" in text


def test_no_fix_column_when_nothing_needs_fixing(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    header = next(line for line in render_table(PASSING, []).splitlines() if "evidence" in line)
    assert "fix" not in header
    header = next(line for line in render_table(FAILING, []).splitlines() if "evidence" in line)
    assert "fix" in header
