"""The lint study's published figures: counted from a study run, rendered as the markdown
that README.md and docs/lint.md quote (tests/unit/test_lint_study_figures.py checks them).

    python benchmarks/lint_study.py --mirrors DIR --figures benchmarks/results/lint_study.json
    python benchmarks/lint_study_figures.py [RESULTS]   # print the markdown to paste

Counts are judged findings (sampled, verdict true/false), per rule and per class: a rule is
"hygiene" when it is in phalanx.lint.rules.HYGIENE (style, deprecation, cleanup), else
"analysis".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "lint_study.json"


def rule_class(code: str) -> str:
    from phalanx.lint.rules import HYGIENE
    return "hygiene" if code in HYGIENE else "analysis"


def figures(groups: dict[str, list[dict]]) -> dict:
    """{set name: [results]} (scored, matched) -> per set and overall: per-rule,
    per-class and per-severity [true, false] counts of the judged findings."""
    out: dict = {"sets": {}}
    every = [r for rs in groups.values() for r in rs]
    for name, rs in [*groups.items(), ("overall", every)]:
        per_rule: dict[str, list[int]] = {}
        per_class = {"analysis": [0, 0], "hygiene": [0, 0]}
        per_sev = {"error": [0, 0], "warning": [0, 0]}
        for r in rs:
            for f in r["findings"]:
                if not f.get("sampled") or f.get("verdict") not in ("true", "false"):
                    continue
                i = int(f["verdict"] == "false")
                per_rule.setdefault(f["code"], [0, 0])[i] += 1
                per_class[rule_class(f["code"])][i] += 1
                per_sev[f["severity"]][i] += 1
        fig = {"projects": len(rs), "per_severity": per_sev, "per_class": per_class,
               "per_rule": dict(sorted(per_rule.items()))}
        if name == "overall":
            out["overall"] = fig
        else:
            out["sets"][name] = fig
    return out


def pct(t: int, n: int) -> str:
    return f"{100 * t / n:.0f} %" if n else "-"


def sentence(fig: dict) -> str:
    """The one sentence README.md and docs/lint.md both quote."""
    from phalanx.lint.rules import HYGIENE
    o = fig["overall"]
    (at, af), (ht, hf) = o["per_class"]["analysis"], o["per_class"]["hygiene"]
    return (f"on all {o['projects']} projects, {at + ht} of {at + af + ht + hf} judged "
            f"findings are right, but {ht} of those are hygiene rules ({', '.join(sorted(HYGIENE))}: "
            f"{ht} of {ht + hf}, {pct(ht, ht + hf)}); the analysis rules' own precision "
            f"is {at} of {at + af} ({pct(at, at + af)})")


def table(fig: dict) -> str:
    """Per-rule precision, all sets together, for docs/lint.md."""
    rows = ["| rule | class | right | false | precision |", "|---|---|---|---|---|"]
    for code, (t, f) in fig["overall"]["per_rule"].items():
        rows.append(f"| {code} | {rule_class(code)} | {t} | {f} | {pct(t, t + f)} |")
    for cls, (t, f) in fig["overall"]["per_class"].items():
        rows.append(f"| **{cls}** | | {t} | {f} | {pct(t, t + f)} |")
    return "\n".join(rows)


def class_table(fig: dict) -> str:
    """Per set and class, for docs/lint.md."""
    rows = ["| set | analysis right | hygiene right |", "|---|---|---|"]
    for name, s in [*fig["sets"].items(), ("overall", fig["overall"])]:
        cells = [f"{t} of {t + f} ({pct(t, t + f)})" for t, f in s["per_class"].values()]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def load(path: Path = RESULTS) -> dict:
    return json.loads(path.read_text())


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    if not path.is_file():
        print(f"no results file at {path}: run lint_study.py --figures first", file=sys.stderr)
        return 2
    fig = load(path)
    print(sentence(fig) + "\n\n" + class_table(fig) + "\n\n" + table(fig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
