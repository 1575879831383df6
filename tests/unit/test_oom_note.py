"""Beside a rank killed by SIGKILL (the kernel's OOM killer, most often), the launcher
shows the plan's predicted peak for the run's flags (phalanx.plan.oom), asked only then."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from phalanx.config.sections import Config
from phalanx.launch.failures import job_failed
from phalanx.plan.devices import device
from phalanx.plan.oom import predicted_peak_note
from phalanx.plan.recommend import plan


@dataclass
class Failure:  # the fields of torch's ProcessFailure that Phalanx reads
    exitcode: int
    message: object = ""


def test_the_note_is_the_plans_peak_for_every_strategy():
    cfg = Config()
    cfg.model.n_layer, cfg.model.n_embd, cfg.train.micro_batch_size = 4, 256, 8
    rows = plan(cfg, 2, device(None), 0.4, None, None)["rows"]
    note = predicted_peak_note(cfg, 2)
    for row in rows:  # the same figures `phalanx plan` shows
        assert f"{row['strategy']} {row['peak'] / 2**30:.2f} GiB" in note, note
    assert note.startswith("the plan predicts per rank at its peak, for this run's flags: ")
    assert "for its 2 rank(s)" in note
    cfg.model.factory = "mylm:make"  # a user's model: the plan traces it, not the formulas
    assert "`phalanx plan --model`" in predicted_peak_note(cfg, 2)


def test_asked_only_beside_a_rank_killed_by_sigkill():
    asked: list[int] = []

    def memory() -> str:
        asked.append(1)
        return "the plan predicts 9 GiB"

    error = str(job_failed({1: Failure(-signal.SIGKILL)}, 0, memory=memory))
    assert "out-of-memory killer" in error and "says so; the plan predicts 9 GiB)" in error
    assert asked == [1]
    error = str(job_failed({1: Failure(1, {"message": "RuntimeError: boom"})}, 0,
                           memory=memory))
    assert asked == [1] and "plan" not in error
    error = str(job_failed({1: Failure(-signal.SIGKILL)}, 0))  # no plan handed down
    assert "`phalanx plan` with this run's flags predicts each rank's peak memory" in error
