"""Which rules run by default, from their precision on code Phalanx was not tuned on.

`HELD_OUT`: rule → (right, false), every finding judged in the lint study's held-out
sets, pooled, verdicts kept for findings fixed since ("before any fix"; counted by
`benchmarks/lint_evidence.py` from `benchmarks/lint_study/judgments.json`, and checked
against it by tests/unit/test_lint_evidence.py). The policy (`standing`):

- hygiene rules (style, deprecation, cleanup: right by construction) run;
- errors run: they are the deadlocks and crashes the linter exists for (their own
  evidence is printed by `--explain`);
- a warning with at least `ENOUGH` judged findings runs when at least `PRECISION` of
  them were right;
- a warning with fewer is "not enough evidence": it runs only while none was false;
- the rules kept opt-in by hand (`MANUAL`) stay so.

A rule that does not run by default runs when `--select` names it, or `--select ALL`.
"""

from __future__ import annotations

PRECISION = 0.80
ENOUGH = 10

HELD_OUT = {
    "PX101": (2, 2),
    "PX103": (0, 5),
    "PX104": (4, 7),
    "PX105": (0, 1),
    "PX108": (3, 0),
    "PX201": (4, 6),
    "PX302": (2, 2),
    "PX303": (0, 15),
    "PX401": (2, 2),
    "PX404": (0, 2),
    "PX501": (0, 12),
    "PX504": (0, 13),
    "PX602": (1, 0),
    "PX603": (46, 0),
    "PX701": (1, 4),
    "PX702": (49, 4),
    "PX801": (2, 0),
    "PX802": (4, 0),
    "PX902": (0, 1),
}

# find_unused_parameters; rank-0 metric; torch.load without map_location (0 of 5 judged
# true on public code: RNG, scheduler and CPU-saved states); an explicit
# weights_only=False (a deliberate choice, judged false on a run's own caches); BatchNorm
# without SyncBatchNorm (a choice, not a defect)
MANUAL = frozenset({"PX703", "PX705", "PX501", "PX502", "PX704"})


def evidence(code: str) -> str:
    """`4 of 7 right on held-out code` — or that none was judged there."""
    right, false = HELD_OUT.get(code, (0, 0))
    n = right + false
    return f"{right} of {n} right on held-out code" if n else "no held-out finding judged"


def standing(code: str, severity: str, hygiene: bool) -> tuple[bool, str]:
    """(runs by default, why) for a rule."""
    right, false = HELD_OUT.get(code, (0, 0))
    n, seen = right + false, evidence(code)
    if code in MANUAL:
        return False, f"opt-in by design ({seen})"
    if hygiene:
        return True, f"hygiene: on ({seen})"
    if severity == "error":
        return True, f"error: on ({seen})"
    if n >= ENOUGH:
        on = right >= PRECISION * n
        return on, (f"{'on' if on else 'opt-in'}: {seen}, "
                    f"{'at least' if on else 'under'} {PRECISION:.0%}")
    if false:
        return False, f"opt-in: not enough evidence ({seen}) and a false finding among it"
    return True, f"on: not enough evidence yet ({seen}), none false"
