"""Each lint rule's evidence on code Phalanx was not tuned on: the verdicts of every
finding ever judged in the held-out sets of the lint study (benchmarks/lint_study/:
`judgments.json` keeps a verdict after the finding it judged is fixed, so these are the
"before any fix" verdicts, pooled), counted per rule as (right, false).

    python benchmarks/lint_evidence.py          # print HELD_OUT for lint/rules/evidence.py

tests/unit/test_lint_evidence.py checks that src/phalanx/lint/rules/evidence.py holds
exactly what this counts from the committed judgments.
"""

from __future__ import annotations

import json
from pathlib import Path

STUDY = Path(__file__).resolve().parent / "lint_study"


def held_out_verdicts(study: Path = STUDY) -> dict[str, tuple[int, int]]:
    """Rule code → (right, false) over the judged findings of the held-out sets."""
    sets = {p["repo"]: p["set"] for p in json.loads((study / "projects.json").read_text())}
    counts: dict[str, list[int]] = {}
    for j in json.loads((study / "judgments.json").read_text()):
        if sets.get(j["repo"], "").startswith("held-out") and j["verdict"] in ("true", "false"):
            counts.setdefault(j["code"], [0, 0])[j["verdict"] == "false"] += 1
    return {code: (t, f) for code, (t, f) in sorted(counts.items())}


def main() -> None:
    print("HELD_OUT = {")
    for code, pair in held_out_verdicts().items():
        print(f'    "{code}": {pair},')
    print("}")


if __name__ == "__main__":
    main()
