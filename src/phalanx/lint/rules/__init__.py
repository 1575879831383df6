"""Rule families; `ALL` in code order. `OPT_IN`: rules that run only when `--select`
names them (by code or prefix, or `ALL`) — advice whose precision on code Phalanx was not
tuned on does not earn it a place in every run (`STANDING`, from rules/evidence.py)."""

from __future__ import annotations

from phalanx.lint.rules import (
                                accumulation,
                                amp,
                                checkpoints,
                                collectives,
                                data,
                                layouts,
                                metrics,
                                placement,
                                ranks,
                                setup,
                                sharded,
)
from phalanx.lint.rules.evidence import standing

FAMILIES = (placement, data, collectives, accumulation, checkpoints, amp, setup, ranks, metrics,
            sharded, layouts)
ALL = sorted((rule for family in FAMILIES for rule in family.RULES), key=lambda r: r.code)
BY_CODE = {rule.code: rule for rule in ALL}
# "hygiene": style, deprecation or cleanup that never deadlocks, crashes or computes a wrong
# result (nn.DataParallel, the deprecated torch.cuda.amp, no destroy_process_group,
# find_unused_parameters); every other rule is "analysis" (flow of collectives, ranks,
# devices, data). benchmarks/lint_study.py reports the two classes' precision apart.
HYGIENE = frozenset({"PX101", "PX603", "PX702", "PX703"})
# Whether each rule runs by default, and why: its precision on held-out code (evidence.py)
STANDING = {r.code: standing(r.code, r.severity, r.code in HYGIENE) for r in ALL}
OPT_IN = frozenset(code for code, (on, _) in STANDING.items() if not on)
