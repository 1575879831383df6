"""The lint precision figures in README.md and docs/lint.md are the ones
benchmarks/lint_study.py wrote to benchmarks/results/lint_study.json (no network, no
mirrors: the committed results file is the source)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import lint_study_figures as lsf  # noqa: E402


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_hygiene_rules_exist() -> None:
    from phalanx.lint.rules import BY_CODE, HYGIENE
    assert HYGIENE <= BY_CODE.keys()


def test_results_file_is_consistent() -> None:
    fig = lsf.load()
    o = fig["overall"]
    for key in ("per_class", "per_severity"):
        assert [sum(v[i] for v in o[key].values()) for i in (0, 1)] == \
            [sum(v[i] for v in o["per_rule"].values()) for i in (0, 1)], key
    for code, (t, f) in o["per_rule"].items():
        assert [sum(s["per_rule"].get(code, [0, 0])[i] for s in fig["sets"].values())
                for i in (0, 1)] == [t, f], code


def test_readme_quotes_the_study() -> None:
    fig = lsf.load()
    readme = _flat((ROOT / "README.md").read_text())
    assert _flat(lsf.sentence(fig)) in readme, "README.md: re-run benchmarks/lint_study_figures.py"


def test_docs_quote_the_study() -> None:
    fig = lsf.load()
    docs = (ROOT / "docs" / "lint.md").read_text()
    assert _flat(lsf.sentence(fig)) in _flat(docs)
    for block in (lsf.class_table(fig), lsf.table(fig)):
        assert block in docs, "docs/lint.md: paste `python benchmarks/lint_study_figures.py`"
