"""Rule families; `ALL` in code order."""

from __future__ import annotations

from phalanx.lint.rules import (accumulation, amp, checkpoints, collectives, data, metrics,
                                placement, ranks, setup)

ALL = sorted((rule for family in (placement, data, collectives, accumulation, checkpoints, amp,
                                  setup, ranks, metrics) for rule in family.RULES), key=lambda r: r.code)
BY_CODE = {rule.code: rule for rule in ALL}
