"""Which lint rules run by default comes from their precision on code Phalanx was not
tuned on (src/phalanx/lint/rules/evidence.py), counted from the study's committed
verdicts (benchmarks/lint_evidence.py) — and the policy's boundaries."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import lint_evidence  # noqa: E402

from phalanx.cli.dispatch import main  # noqa: E402
from phalanx.lint.rules import OPT_IN, STANDING, evidence  # noqa: E402


def test_the_evidence_is_what_the_held_out_verdicts_count():
    assert evidence.HELD_OUT == lint_evidence.held_out_verdicts(), (
        "src/phalanx/lint/rules/evidence.py: paste `python benchmarks/lint_evidence.py`")


@pytest.mark.parametrize("held_out, severity, hygiene, on", [
    ((8, 2), "warning", False, True),    # 10 judged, 80 %: on
    ((7, 3), "warning", False, False),   # 10 judged, 70 %: opt-in
    ((15, 4), "warning", False, False),  # 19 judged, 79 %: opt-in
    ((9, 0), "warning", False, True),    # too few, none false: on
    ((8, 1), "warning", False, False),   # too few, one false: opt-in
    ((0, 0), "warning", False, True),    # none judged: on
    ((0, 8), "error", False, True),      # errors run (their soundness is another matter)
    ((1, 4), "warning", True, True),     # hygiene runs
], ids=["10-at-80", "10-at-70", "19-at-79", "9-none-false", "9-one-false", "none",
        "error", "hygiene"])
def test_the_policy_at_its_boundaries(monkeypatch, held_out, severity, hygiene, on):
    monkeypatch.setitem(evidence.HELD_OUT, "PX999", held_out)
    assert evidence.standing("PX999", severity, hygiene)[0] is on


def test_a_rule_under_80_percent_on_held_out_code_is_opt_in():
    right, false = evidence.HELD_OUT["PX504"]
    assert right + false >= evidence.ENOUGH and right < 0.8 * (right + false)
    assert "PX504" in OPT_IN and STANDING["PX504"][0] is False
    assert STANDING["PX603"][0] and STANDING["PX702"][0]  # hygiene stays on


def test_a_default_run_says_what_it_left_out_and_select_runs_it(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("import torch\nimport torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\ntorch.save({}, 'x.pt')\n"
                      "dist.destroy_process_group()\n")
    main(["lint", str(script)])
    out = capsys.readouterr().out
    assert "PX504 [warning]" not in out
    assert "opt-in, for their precision on code Phalanx was not tuned on:" in out
    assert f"PX504 {evidence.HELD_OUT['PX504'][0]}/{sum(evidence.HELD_OUT['PX504'])} right" \
        in out
    main(["lint", "--select", "PX504", str(script)])
    out = capsys.readouterr().out
    assert "PX504 [warning]" in out and "opt-in, for" not in out
    main(["lint", "--explain", "PX504"])
    assert "By default: opt-in: 0 of 13 right on held-out code, under 80%" in \
        capsys.readouterr().out


def test_a_hang_report_citing_an_opt_in_rule_says_how_to_run_it():
    from phalanx.lint.divergence import citation
    from phalanx.lint.engine import Finding

    def finding(code):
        return Finding("train.py", 9, 1, code, "warning", "m (under `if rank == 0:`)", "f")
    assert "PX302" in OPT_IN and "PX301" not in OPT_IN
    assert citation([finding("PX302")]).startswith("`phalanx lint --select PX302` finds")
    assert citation([finding("PX301")]).startswith("`phalanx lint` finds")
