"""A warning about a run that still trains: a loss spike, said once per episode on rank 0
and recorded in the run's events (phalanx.report.events). (A rank persistently slower
than the others — a straggler — is `run.step`'s check: phalanx.runtime.pace.)

Spikes (`--spike-factor K`, 0: off): a step's global mean loss above K × the median of
the last 50 logged step losses (judged once 10 are known) is a spike.
"""

from __future__ import annotations

import statistics
from collections import deque

SPIKE_WINDOW, SPIKE_MIN_HISTORY = 50, 10


class SpikeWatch:
    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.history: deque[float] = deque(maxlen=SPIKE_WINDOW)
        self.in_spike = False

    def check(self, step: int, loss: float) -> str | None:
        """The warning for `loss` at `step`, when it starts a spike."""
        if self.factor > 0 and len(self.history) >= SPIKE_MIN_HISTORY:
            median = statistics.median(self.history)
            if median > 0 and loss > self.factor * median:
                started, self.in_spike = not self.in_spike, True
                if started:
                    return (f"step {step}: loss {loss:.4f} is {loss / median:.1f}× the median "
                            f"of the last {len(self.history)} steps ({median:.4f}), over "
                            f"--spike-factor {self.factor:g}: a loss spike. If it recurs, "
                            f"lower --lr, lengthen --warmup-steps or clip harder (--grad-clip).")
                return None
        self.in_spike = False
        self.history.append(loss)
        return None
