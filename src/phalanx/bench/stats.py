"""Ratios that survive a noisy machine: paired by round, with a bootstrap interval.

`compare` runs every implementation once per round, in alternating order, so round i
of A and round i of B saw the same conditions (the other jobs on the machine, the
caches, the clock). The ratio A_i / B_i cancels what drifts between rounds; its median
over rounds, with a percentile-bootstrap 95 % interval, says whether A is faster than
B on this machine or the difference is within the noise.
"""

from __future__ import annotations

import random
import statistics


def paired_ratios(a: list[float], b: list[float]) -> list[float]:
    if len(a) != len(b) or not a:
        raise ValueError(f"paired ratios need two equally long, non-empty series; got "
                         f"{len(a)} and {len(b)} rounds")
    return [x / y for x, y in zip(a, b)]


def ratio_interval(a: list[float], b: list[float], *, resamples: int = 2000,
                   confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(median of A_i / B_i, low, high): the bootstrap interval of that median."""
    ratios = paired_ratios(a, b)
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = medians[int(tail * (resamples - 1))]
    high = medians[int((1 - tail) * (resamples - 1))]
    return statistics.median(ratios), low, high


def verdict(low: float, high: float, goal: float) -> str:
    """Whether the interval says the goal (ratio <= goal) is met, missed, or not shown."""
    if high <= goal:
        return "met"
    if low > goal:
        return "missed"
    return "within noise"
