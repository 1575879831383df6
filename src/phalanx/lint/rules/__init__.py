"""Rule families; `ALL` in code order."""

from __future__ import annotations

from phalanx.lint.rules import (
                                accumulation,
                                amp,
                                checkpoints,
                                collectives,
                                data,
                                metrics,
                                placement,
                                ranks,
                                setup,
                                sharded,
)

FAMILIES = (placement, data, collectives, accumulation, checkpoints, amp, setup, ranks, metrics,
            sharded)
ALL = sorted((rule for family in FAMILIES for rule in family.RULES), key=lambda r: r.code)
BY_CODE = {rule.code: rule for rule in ALL}
