"""MLflow, from a bounded background queue: rank 0's `log` only enqueues, so a tracking
server that is slow or down never stalls a training step (MLflow's client retries each
request with backoff for minutes). One thread opens the MLflow run and sends the records;
when it fails, or a request has been waiting longer than STALL_S, the next `log` raises
(report.trackers says it once and drops the tracker), and records are dropped — never the
training's — when the queue is full. `close` waits at most CLOSE_S for what is queued.

MLflow's own environment is honoured: `MLFLOW_TRACKING_URI` (default: MLflow's, a local
`mlruns` folder), `MLFLOW_EXPERIMENT_NAME` (default `phalanx`). The run's id is kept in
`OUT/trackers.json` with the last step sent, so a resumed run continues the same MLflow
run and does not send the steps it replays again. The run's configuration and environment
go in as params (`run_config.train.lr` …); MLflow refuses a param whose value changes, so
a setting changed on resume goes in as a tag `resumed.<key>` instead."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from phalanx.report.tracker_state import keep_state, kept_state, params_of

STALL_S = float(os.environ.get("PHALANX_TRACKER_STALL_S", "30"))  # a request this old: dropped
CLOSE_S = 10.0  # at the end, the queue gets this long to drain
QUEUE = 10_000  # records waiting at most
PARAM_CHARS = 6000  # MLflow's limit on a param's value


class MlflowTracker:
    """One MLflow run per Phalanx run directory, fed by a background thread. `first`: the
    first step it has not been sent (`Tracking.log` sends none below it)."""

    name, shown = "mlflow", "MLflow"

    def __init__(self, out_dir: Path, say: Callable[[str], None]) -> None:
        import mlflow  # noqa: F401 - fail here, in one line, when it is not importable

        self.out_dir, self.say = Path(out_dir), say
        self.kept = kept_state(out_dir, self.name)
        self.first = int(self.kept.get("last_step", -1)) + 1 if self.kept.get("run_id") else 0
        self.params = flat(params_of(out_dir))
        self.queue: queue.Queue = queue.Queue(QUEUE)
        self.failed: BaseException | None = None
        self.busy_since: float | None = time.monotonic()  # opening the run counts
        self.last_sent = self.first - 1
        self.full = False
        self.run_id: str | None = None
        self.thread = threading.Thread(target=self._work, name="phalanx-mlflow", daemon=True)
        self.thread.start()

    def log(self, record: dict[str, Any]) -> None:
        self._raise_if_failing()
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            if not self.full:
                self.full = True
                self.say(f"phalanx: warning: MLflow is {QUEUE} records behind; records are "
                         f"dropped until it catches up (metrics.jsonl has every figure).")

    def close(self) -> None:
        """Send what is queued (waiting at most CLOSE_S) and end the MLflow run; raises
        when MLflow failed or did not take it all (report.trackers says so)."""
        try:
            self._raise_if_failing()  # stalled already: no wait
            try:
                self.queue.put(None, timeout=CLOSE_S)  # the end
            except queue.Full:
                pass
            self.thread.join(CLOSE_S)
            self._raise_if_failing()
            if self.thread.is_alive():
                raise TimeoutError(f"MLflow did not take the last records in {CLOSE_S:g} s")
        finally:
            if self.run_id is not None:
                keep_state(self.out_dir, self.name, {"run_id": self.run_id,
                                                     "last_step": self.last_sent})

    def _raise_if_failing(self) -> None:
        if self.failed is not None:
            raise self.failed
        busy = self.busy_since
        if busy is not None and time.monotonic() - busy > STALL_S:
            self.failed = TimeoutError(f"no answer from the MLflow tracking server in "
                                       f"{STALL_S:g} s")
            raise self.failed

    def _work(self) -> None:
        try:
            client = self._open()
            self.busy_since = None
            while (record := self.queue.get()) is not None:
                if self.failed is None:
                    self.busy_since = time.monotonic()
                    self._send(client, record)
                    self.busy_since = None
            if self.failed is None:
                client.set_terminated(self.run_id)
        except BaseException as exc:  # noqa: BLE001 - said by the training thread
            self.failed = self.failed or exc
            self.busy_since = None
            while True:  # let `close` finish: drain to the end marker
                try:
                    if self.queue.get(timeout=CLOSE_S) is None:
                        return
                except queue.Empty:
                    return

    def _open(self):
        from mlflow.tracking import MlflowClient

        client = MlflowClient()
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "phalanx")
        experiment = client.get_experiment_by_name(name)
        eid = experiment.experiment_id if experiment else client.create_experiment(name)
        kept = self.kept.get("run_id")
        if kept:
            run = client.get_run(kept)
            client.update_run(kept, status="RUNNING")
        else:
            run = client.create_run(eid, run_name=self.out_dir.resolve().name)
        self.run_id = run.info.run_id
        keep_state(self.out_dir, self.name, {"run_id": self.run_id,
                                             "last_step": self.first - 1})
        self._log_params(client, dict(run.data.params))
        return client

    def _log_params(self, client, before: dict[str, str]) -> None:
        from mlflow.entities import Param, RunTag

        new = [Param(k, v) for k, v in self.params.items() if k not in before]
        changed = [RunTag(f"resumed.{k}", v) for k, v in self.params.items()
                   if k in before and before[k] != v]
        for start in range(0, len(new), 100):  # MLflow takes 100 params per batch
            client.log_batch(self.run_id, params=new[start:start + 100])
        if changed:
            client.log_batch(self.run_id, tags=changed)

    def _send(self, client, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(record["step"]), int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in record.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
        if metrics:
            client.log_batch(self.run_id, metrics=metrics)
        self.last_sent = step


def flat(tree: Any, prefix: str = "") -> dict[str, str]:
    """{"run_config.train.lr": "0.001", …}: nested dicts as dotted keys, values as text
    (cut to MLflow's limit)."""
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: str(tree)[:PARAM_CHARS]} if prefix else {}
