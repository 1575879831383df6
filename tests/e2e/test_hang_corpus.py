"""CI's sample of the hang-and-straggler corpus (tests/hang_corpus): each case's report
names the culprit rank, the line where the ranks parted and the collective, and a healthy
loop that shows the same line at every look of the watchdog (a rank sleeping 1 s a step,
the timeout 4 s: a straggler, not a hang) is no false alarm.
The whole corpus and its score table: `python tests/hang_corpus/score.py` (docs/doctor.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "hang_corpus"))
from cases import CASES  # noqa: E402
from score import run_case  # noqa: E402


@pytest.mark.parametrize("case", [c for c in CASES if c.ci], ids=lambda c: c.name)
def test_the_doctor_names_what_parted_the_ranks(case, tmp_path):
    score = run_case(case, tmp_path, timeout_s=4)
    assert score.verdict.startswith("right"), (score.verdict, score.report)
    if not case.healthy:  # the watchdog's timeout (4 s) + its polling + the flight
        # recorder's history (torch gathers its stacks: ~3-4 s the first time), after the fault
        assert score.seconds is not None and score.seconds < 4 + 11, score.seconds


@pytest.mark.full
@pytest.mark.parametrize("case", [c for c in CASES if not c.ci], ids=lambda c: c.name)
def test_the_rest_of_the_corpus_runs(case, tmp_path):
    """The rest is scored, not all right yet (docs/doctor.md's table): each verdict is
    the one recorded with its case, so a change either way is seen."""
    score = run_case(case, tmp_path, timeout_s=4)
    assert score.verdict == case.verdict, (score.verdict, score.report)
