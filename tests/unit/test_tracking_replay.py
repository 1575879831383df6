"""`Tracking.log` sends no tracker a step below its `first` (a resume from an older
checkpoint replays steps the tracker holds already) and says so once per tracker."""

from __future__ import annotations

from pathlib import Path

from phalanx.report.trackers import Tracking


class Fake:
    def __init__(self, name: str, shown: str, first: int) -> None:
        self.name, self.shown, self.first, self.sent = name, shown, first, []

    def log(self, record: dict) -> None:
        self.sent.append(record["step"])


def test_replayed_steps_are_sent_to_no_tracker_and_said_once_each(tmp_path: Path):
    said: list[str] = []
    tracking = Tracking(("wandb", "mlflow"), tmp_path, said.append)
    wandb, mlflow = Fake("wandb", "W&B", 3), Fake("mlflow", "MLflow", 5)
    tracking.open = [wandb, mlflow]
    for step in range(1, 7):
        tracking.log({"step": step, "loss": 1.0})
    assert wandb.sent == [3, 4, 5, 6] and mlflow.sent == [5, 6]
    assert said == [f"phalanx: note: {shown} keeps the steps it was sent before; steps below "
                    f"{first} trained again after this resume are not sent to it again "
                    f"(metrics.jsonl has them)." for shown, first in (("W&B", 3), ("MLflow", 5))]
