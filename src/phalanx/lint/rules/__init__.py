"""Rule families; `ALL` in code order. `OPT_IN`: rules that run only when `--select`
names them (by code or prefix, or `ALL`) — advice whose precision on real code does not
earn it a place in every run."""

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
# find_unused_parameters; rank-0 metric; torch.load without map_location (0 of 5 judged
# true on public code: RNG, scheduler and CPU-saved states); an explicit
# weights_only=False (a deliberate choice, judged false on a run's own caches)
OPT_IN = frozenset({"PX703", "PX705", "PX501", "PX502", "PX704"})
# "hygiene": style, deprecation or cleanup that never deadlocks, crashes or computes a wrong
# result (nn.DataParallel, the deprecated torch.cuda.amp, no destroy_process_group,
# find_unused_parameters); every other rule is "analysis" (flow of collectives, ranks,
# devices, data). benchmarks/lint_study.py reports the two classes' precision apart.
HYGIENE = frozenset({"PX101", "PX603", "PX702", "PX703"})
