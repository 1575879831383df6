"""The trainer's rank-0 bookkeeping between log points: the progress line, metrics.jsonl
(through `run.log`), throughput, the window's mean gradient norm and loss-spike warnings."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from phalanx.config.sections import Config
from phalanx.paths import RunDir
from phalanx.report.events import record_event, warn
from phalanx.report.goodput import Ledger, summarise
from phalanx.report.progress import ProgressReporter
from phalanx.report.sink import peak_memory_mib, tensorboard_note
from phalanx.runtime.run import Run
from phalanx.train.state import TrainResult
from phalanx.train.watchers import SpikeWatch


class Logger:
    """Rank-0 bookkeeping: progress, metrics.jsonl, throughput between log points."""

    def __init__(self, run: Run, cfg: Config, out_dir: RunDir | Path | None,
                 start_step: int) -> None:
        self.run, self.cfg = run, cfg
        main = run.is_main and out_dir is not None
        if out_dir is not None:  # before the first progress line, once per run
            run.say_once(tensorboard_note(out_dir))
        self.progress = ProgressReporter(cfg.train.max_steps, start_step) if main else None
        self.out_dir, self.spikes = out_dir, SpikeWatch(cfg.train.spike_factor)
        self.writes = out_dir is not None  # through run.log (rank 0 writes)
        if out_dir is not None:  # self.writes
            run.log_dir = Path(out_dir)
        self.pending: list[torch.Tensor] = []
        self.t_last, self.steps_since = time.perf_counter(), 0
        self.first = start_step + 1  # this process's first step: said at once
        self.ledger = Ledger(out_dir, main)  # OUT/goodput.jsonl (report.goodput)
        self.ledger.start(start_step)
        self.step = start_step  # the last step taken

    def rebase(self, step: int) -> None:
        """The state jumped to `step` (a torchft group healed from a live one): progress
        and throughput count from here, not over the steps it did not take."""
        if self.progress is not None:
            self.progress = ProgressReporter(self.cfg.train.max_steps, step)
        self.pending, self.steps_since, self.t_last = [], 0, time.perf_counter()
        self.restarted(step)

    def restarted(self, step: int) -> None:
        """The state jumped to `step` (a heal, a rollback): the goodput ledger closes the
        segment where it was and starts one from `step`."""
        self.ledger.reached(self.step)
        self.ledger.start(step, launched=False)
        self.step = step

    def step_done(self, loss: torch.Tensor, seconds: float, skipped: bool = False) -> None:
        """After each optimizer step (taking `seconds`): it counts for throughput and
        goodput; its loss is reported unless the step was skipped (a NaN guard's skip is
        not averaged in)."""
        self.ledger.stepped(seconds)
        self.step += 1
        if not skipped:
            self.pending.append(loss)
        self.steps_since += 1

    def rolled_back(self, step: int) -> None:
        """Steps past a rollback's checkpoint (of `step`) are trained again: their losses
        are not reported, and the metrics from that step on are written anew (MetricsSink)."""
        self.restarted(step)
        self.pending, self.steps_since = [], 0
        self.t_last = time.perf_counter()
        if self.writes:
            self.run.end_log()

    def step_ended(self, step: int) -> bool:
        """After each optimizer step; after this process's first one (True), rank 0 says
        so in one line (no collective): the start-up is over, long before the first
        logged step."""
        if step != self.first:
            return False
        if self.progress is not None and step % self.cfg.train.log_every != 0:
            self.progress.first_step(step, time.perf_counter() - self.t_last,
                                     self.cfg.train.log_every)
        return True

    def flush(self, step: int, lr: float, result: TrainResult) -> dict:
        """All-reduce the losses since the last flush (one collective) and report them,
        with the window's mean gradient norm, time per step and rank 0's peak memory."""
        if not self.pending:
            return {"step": step}
        mean = self.run.all_reduce_mean(torch.stack(self.pending)).tolist()
        result.losses.extend(mean)
        for i, value in enumerate(mean):  # the same on every rank: rank 0 says it
            at = step - len(mean) + 1 + i
            spike = self.spikes.check(at, value)
            if spike:
                warn(self.run, self.out_dir, "spike", at, spike)
        elapsed = time.perf_counter() - self.t_last
        tokens = self.steps_since * self.cfg.tokens_per_step(self.run.topology.dp_size)
        self.ledger.reached(step)
        record = {"step": step, "loss": sum(mean) / len(mean), "lr": lr,
                  "tokens_per_s": tokens / max(elapsed, 1e-9),
                  "step_time_s": elapsed / max(1, self.steps_since),
                  "memory_mib": peak_memory_mib(self.run.device)}
        norm = _settle_norms(result.grad_norms, self.steps_since)
        if norm is not None:  # the global norm: the same on every rank
            record["grad_norm"] = norm
        pace = self.run.pace  # the last straggler check's scores (runtime.pace)
        if pace is not None and pace.latest is not None:
            record.update(pace.latest.metrics())
        if self.progress is not None:
            self.progress.update(step, record["loss"], record["tokens_per_s"], lr)
        self.pending, self.steps_since = [], 0
        return record

    def write(self, record: dict) -> None:
        if self.writes:
            self.run.log(record["step"], reduce=None,
                         **{k: v for k, v in record.items() if k != "step"})
        if self.progress is not None and "val_loss" in record:
            per_byte = record.get("val_nats_per_byte")
            self.progress.message(f"step {record['step']}: val loss {record['val_loss']:.4f}"
                                  + (f" ({per_byte:.4f} nats/byte)" if per_byte is not None
                                     and per_byte != record["val_loss"] else ""))
        self.t_last = time.perf_counter()

    def close(self) -> None:
        """The end of this process's training, however it ended: the ledger's last record,
        and (rank 0) the run's goodput so far said as an event of the run."""
        self.ledger.reached(self.step, "end")
        found = summarise(self.out_dir) if self.out_dir is not None and \
            self.ledger.path is not None else None
        if found is not None:
            record_event(self.out_dir, "goodput", self.step, found.line())
        if self.progress is not None:
            self.progress.close()
        if self.writes:
            self.run.end_log()


def _settle_norms(norms: list, last: int) -> float | None:
    """The mean of the `last` steps' gradient norms (None where none was taken), read
    from the device in one copy, not one host sync per step; those entries of `norms`
    become floats, so a long run keeps no device tensor per step."""
    window = [i for i in range(max(0, len(norms) - last), len(norms)) if norms[i] is not None]
    held = [i for i in window if isinstance(norms[i], torch.Tensor)]
    if held:
        for i, value in zip(held, torch.stack([norms[i].float() for i in held]).cpu().tolist()):
            norms[i] = value
    if not window:
        return None
    return torch.tensor([norms[i] for i in window], dtype=torch.float32).mean().item()
