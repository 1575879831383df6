"""The straggler rule on its own (runtime.pace): own time = step − waits, judged against
the other ranks (on 2 gloo ranks, with a slowness planted in each part of the step:
tests/e2e/test_stragglers.py)."""

from __future__ import annotations

import time

import pytest
import torch

from phalanx.runtime.pace import Pace, _median_without


def _pace(world: int = 4, every: int = 5) -> Pace:
    return Pace(world, 0, torch.device("cpu"), every, host_of=lambda rank: f"host{rank}")


def test_a_rank_slow_at_two_checks_in_a_row_is_named_once():
    pace = _pace()
    healthy, slow = [0.010, 0.011, 0.010, 0.012], [0.010, 0.034, 0.010, 0.011]
    said = [pace.judge(step, times) for step, times in
            [(5, healthy), (10, slow), (15, slow), (20, slow), (25, healthy), (30, slow),
             (35, slow)]]
    assert [s is not None for s in said] == [False, False, True, False, False, False, True]
    assert said[2].startswith("step 15: rank 1 on host1 is a straggler: its own time (the "
                              "step minus its waits in collectives) is 34.0 ms per step, "
                              "3.4× the median of the other ranks (10.0 ms; 3.4× the "
                              "fastest, 3.1× its own best), at 2 checks of 5 steps in a row")
    assert pace.latest.metrics() == pytest.approx(
        {"slowest_rank": 1.0, "slowest_to_fastest": 3.4, "slowest_to_own_best": 34 / 11})


def test_noise_under_the_factor_or_the_gap_is_not_a_straggler():
    pace = _pace(world=2)
    for step in range(5, 200, 5):  # 1.9×, then 3× of a small time (4 ms apart)
        assert pace.judge(step, [0.010, 0.019] if step < 100 else [0.002, 0.006]) is None


def test_own_time_is_the_step_less_its_waits():
    pace = _pace(world=2)
    pace.stepped()  # the first step's end: no time yet
    time.sleep(0.02)
    with pace.waiting():
        with pace.waiting():  # nested: counted once
            time.sleep(0.05)
    pace.stepped()
    [own] = pace.own_times()
    assert 0.015 < own < 0.045, own
    assert pace.waits == []  # the next step's


def test_the_median_of_the_others_is_statistics_median():
    import random
    import statistics

    rng = random.Random(0)
    for n in range(2, 12):
        values = sorted(rng.random() for _ in range(n))
        for i in range(n):
            assert _median_without(values, i) == statistics.median(values[:i] + values[i + 1:])


def test_a_wait_left_open_ends_with_the_step():
    pace = _pace(world=2)
    pace.stepped()
    held = pace.waiting()
    held.__enter__()  # (a forward hook's wait, its forward raised: never left)
    pace.stepped()
    with pace.waiting():
        time.sleep(0.01)
    held.__exit__(None, None, None)  # late: ignored
    pace.stepped()
    assert len(pace.waits) == 0 and len(pace.steps) == 2
    assert pace.own_times()[1] < 0.008  # the second step's wait was counted


@pytest.mark.parametrize("every,world", [(0, 4), (5, 1)])
def test_off_times_nothing(every, world):
    pace = _pace(world, every)
    with pace.waiting():
        pace.stepped()
    pace.stepped()
    assert not pace.on and pace.own_times() == [] and pace.check(5) is None
