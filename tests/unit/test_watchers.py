"""The loss-spike rule, on its own (the straggler rule: tests/unit/test_pace.py, and on 2
ranks tests/e2e/test_stragglers.py and tests/e2e/test_run_report.py)."""

from __future__ import annotations

from phalanx.train.watchers import SpikeWatch


def test_a_spike_is_said_once_per_episode():
    watch = SpikeWatch(2.0)
    said = [watch.check(step, loss) for step, loss in
            enumerate([3.0] * 12 + [6.5, 7.0, 3.1, 9.0] + [3.0] * 3, start=1)]
    assert [i + 1 for i, s in enumerate(said) if s] == [13, 16]
    assert said[12].startswith("step 13: loss 6.5000 is 2.2× the median of the last 12 steps "
                               "(3.0000), over --spike-factor 2")


def test_no_judgement_before_ten_steps_or_when_off():
    early = SpikeWatch(2.0)
    assert [early.check(s, loss) for s, loss in enumerate([1.0] * 9 + [50.0])] == [None] * 10
    off = SpikeWatch(0)
    assert [off.check(s, 100.0 if s == 30 else 1.0) for s in range(40)] == [None] * 40


def test_a_falling_loss_is_not_a_spike():
    watch = SpikeWatch(2.0)
    assert not any(watch.check(s, 5.5 * 0.97 ** s) for s in range(300))
