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


# PX301 was one rule until its findings were split by proof (lint.proof): the proven ones
# stay PX301 (error), the rest are PX303 (warning). Every PX301 finding judged before the
# split was a call the proof does not accept (a helper whose collective a parameter
# gates, a flag the same on every rank, a library method, a subgroup, a DDP forward: each
# verdict's `why` says which; today's lint reports none of them as PX301 at the recorded
# commits), so those verdicts count for PX303. A judgment made after the split records
# `"tiered": true` and counts for the code it names.
BEFORE_SPLIT = {"PX301": "PX303"}


def held_out_verdicts(study: Path = STUDY) -> dict[str, tuple[int, int]]:
    """Rule code → (right, false) over the judged findings of the held-out sets."""
    sets = {p["repo"]: p["set"] for p in json.loads((study / "projects.json").read_text())}
    counts: dict[str, list[int]] = {}
    for j in json.loads((study / "judgments.json").read_text()):
        if sets.get(j["repo"], "").startswith("held-out") and j["verdict"] in ("true", "false"):
            code = j["code"] if j.get("tiered") else BEFORE_SPLIT.get(j["code"], j["code"])
            counts.setdefault(code, [0, 0])[j["verdict"] == "false"] += 1
    return {code: (t, f) for code, (t, f) in sorted(counts.items())}


def main() -> None:
    print("HELD_OUT = {")
    for code, pair in held_out_verdicts().items():
        print(f'    "{code}": {pair},')
    print("}")


if __name__ == "__main__":
    main()
