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


def test_the_summary_names_every_check_that_failed_or_warned(monkeypatch):
    """A "1 failed" at the end of a long table names its check, so it can be found."""
    monkeypatch.setenv("COLUMNS", "120")
    warned = Check("model", "BatchNorm", "warn", "plain BatchNorm", "use SyncBatchNorm")
    last = render_table([*FAILING, warned], []).strip().splitlines()[-1]
    assert last == ("2 passed, 1 warning, 1 failed: compute speed per rank (performance) "
                    "failed; BatchNorm (model) warned."), last
    assert render_table(PASSING, []).strip().splitlines()[-1] == \
        "2 passed, 0 warnings, 0 failed."


@pytest.mark.parametrize("secs,status", [
    ([0.010, 0.0122], "pass"),  # what a loaded machine shows (1.15–1.22×): no straggler
    ([0.010, 0.0149], "pass"), ([0.010, 0.0151], "warn"), ([0.010, 0.031], "fail")])
def test_a_straggler_is_1_5x_the_fastest_and_the_check_says_so(secs, status):
    from phalanx.doctor.comms import straggler_check

    found = straggler_check(secs)
    assert found.status == status, found
    assert "straggler at ≥ 1.5×, fails at ≥ 3×" in found.evidence, found.evidence
    assert f"rank {secs.index(max(secs))} slowest" in found.evidence


@pytest.mark.parametrize("other,status,rounds", [
    ([0.020, 0.020, 0.020], "warn", 3),  # a straggler stays one, however often measured
    ([0.020, 0.010, 0.010], "pass", 2)])  # a busy moment passes: measured again
def test_a_ratio_over_the_threshold_is_measured_again(monkeypatch, other, status, rounds):
    """Two ranks simulated: this one always takes 10 ms; the other's times per round."""
    import torch

    from phalanx.doctor import comms

    times = iter(other)
    monkeypatch.setattr(comms, "_best_of", lambda a, device: 0.010)

    def all_gather(out, mine):
        out[0].copy_(mine)
        out[1].fill_(next(times))

    monkeypatch.setattr(comms.dist, "all_gather", all_gather)
    found = comms.compute_check(torch.device("cpu"), 2)
    assert found.status == status, found
    assert (f"best of {rounds} rounds" in found.evidence) == (rounds > 1), found.evidence
