"""Experiment trackers beside `metrics.jsonl` and TensorBoard: `--tracker wandb,mlflow` (the
trainer and `phalanx run`), `phalanx.init(trackers="wandb")`, or PHALANX_TRACKERS. Rank 0
forwards every record `run.log` writes (the figures the sink measured included) to each
tracker. Each tool's own environment is honoured as Accelerate does (W&B: `WANDB_MODE`,
`WANDB_DIR` — default: the run directory —, `WANDB_PROJECT` — default `phalanx`; MLflow:
`MLFLOW_TRACKING_URI`, `MLFLOW_EXPERIMENT_NAME` — default `phalanx`; report.mlflow_tracker).

A tracker never stops the training: one that cannot start or fails later is said once in
a warning and dropped; `metrics.jsonl` holds every figure regardless. The tracker run's id
is kept in `OUT/trackers.json`, so a resumed run continues the same tracker run (W&B
online: `resume="must"`; an offline W&B run cannot be resumed: a new one is started,
said in one line). The run's `run_config.json` and `environment.json` go in as its config.

The other trackers Accelerate ships (Comet, Aim, ClearML, DVCLive, SwanLab, Trackio) are
not built."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.errors import first_line
from phalanx.report.tracker_state import keep_state, kept_state, params_of


class Tracking:
    """Rank 0's trackers for one run directory, opened at the first record."""

    def __init__(self, names: tuple[str, ...], out_dir: Path,
                 say: Callable[[str], None]) -> None:
        self.names, self.out_dir, self.say = names, Path(out_dir), say
        self.open: list[Any] | None = None
        self.dropped: list[Any] = []  # failed: ended at `close`, quietly (said once already)
        self.replayed: set[str] = set()

    def log(self, record: dict[str, Any]) -> None:
        if self.open is None:
            self.open = [t for t in map(self._start, self.names) if t is not None]
        for tracker in list(self.open):
            if int(record["step"]) < tracker.first:  # a resume from an older checkpoint
                self._replayed(tracker)  # replays steps the tracker holds already
                continue
            try:
                tracker.log(record)
            except Exception as exc:  # noqa: BLE001 - a tracker never stops the training
                self._drop(tracker, f"failed to log step {record.get('step')}", exc)

    def close(self) -> None:
        # a dropped one too (e.g. W&B's run, else still the process's `wandb.run`),
        # quietly: its failure was said when it was dropped
        ending = [(t, True) for t in self.open or []] + [(t, False) for t in self.dropped]
        for tracker, say in ending:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001
                if say:
                    self.say(f"phalanx: warning: tracker {tracker.name}: could not finish: "
                             f"{first_line(exc)}")
        self.open, self.dropped, self.replayed = None, [], set()

    def _start(self, name: str) -> Any:
        from phalanx.report.mlflow_tracker import MlflowTracker

        kinds = {"wandb": WandbTracker, "mlflow": MlflowTracker}
        try:
            return kinds[name](self.out_dir, self.say)
        except Exception as exc:  # noqa: BLE001 - e.g. not logged in, no network
            self.say(f"phalanx: warning: tracker {name} could not start "
                     f"({first_line(exc)}); training goes on without it (metrics.jsonl "
                     f"has every figure).")
            return None

    def _replayed(self, tracker: Any) -> None:
        if tracker.name not in self.replayed:
            self.replayed.add(tracker.name)
            self.say(f"phalanx: note: {tracker.shown} keeps the steps it was sent before; "
                     f"steps below {tracker.first} trained again after this resume are not "
                     f"sent to it again (metrics.jsonl has them).")

    def _drop(self, tracker: Any, what: str, exc: BaseException) -> None:
        assert self.open is not None
        self.open.remove(tracker)
        self.dropped.append(tracker)
        self.say(f"phalanx: warning: tracker {tracker.name} {what} ({first_line(exc)}); "
                 f"it is dropped for the rest of this run, which goes on (metrics.jsonl "
                 f"has every figure).")


def tracking_for(current: Tracking | None, names: tuple[str, ...], out_dir: Path,
                 say: Callable[[str], None]) -> Tracking:
    """The trackers for `out_dir`: `current` when it is for that directory, else a new
    `Tracking` (`current` closed: the log directory changed, so it is another run)."""
    if current is not None and current.out_dir == Path(out_dir):
        return current
    if current is not None:
        current.close()
    return Tracking(names, out_dir, say)


class WandbTracker:
    """Weights & Biases: one W&B run per Phalanx run directory. `first`: the first step
    it has not been sent (`Tracking.log` sends none below it)."""

    name, shown = "wandb", "W&B"

    def __init__(self, out_dir: Path, say: Callable[[str], None]) -> None:
        import wandb

        kept = kept_state(out_dir, self.name)
        mode = os.environ.get("WANDB_MODE", "online")
        where = os.environ.get("WANDB_DIR") or str(out_dir)
        Path(where).mkdir(parents=True, exist_ok=True)
        options: dict[str, Any] = {}
        if kept.get("id") and mode != "offline" and kept.get("mode") != "offline":
            options = {"id": kept["id"], "resume": "must"}
        elif kept.get("id"):
            say(f"phalanx: note: W&B offline runs cannot be resumed: this attempt logs to a "
                f"new offline run beside {kept['id']} (`wandb sync` uploads both).")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "phalanx"), dir=where,
                              name=out_dir.resolve().name, config=params_of(out_dir),
                              mode=mode, **options)  # type: ignore[arg-type]
        self.first = int(getattr(self.run, "step", 0) or 0)  # W&B's next step (resumed)
        keep_state(out_dir, self.name, {"id": self.run.id, "mode": mode})

    def log(self, record: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in record.items() if k != "step"}, step=int(record["step"]))

    def close(self) -> None:
        self.run.finish()
