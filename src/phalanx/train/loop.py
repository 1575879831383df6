"""The built-in trainer, written on the public `Run` API (setup, loader, accumulate,
all-reduce, print) — the same calls a user's own script makes.

One optimizer step = `grad_accum` micro-steps on every rank; only the last micro-step
synchronises gradients. Randomness is re-seeded from (seed, step, rank) at every step,
and the data cursor is a global sample position, so a run's trajectory is a function of
its config alone.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
import torch.nn as nn

from phalanx.config.sections import Config
from phalanx.data import TokenSplits, TokenWindows
from phalanx.data.dataset import Recorded
from phalanx.errors import UserError
from phalanx.cluster.faults import fault_point
from phalanx.models import build_model
from phalanx.paths import atomic_write
from phalanx.strategies.precision import Precision
from phalanx.report.events import warn
from phalanx.cluster.startup_trace import mark
from phalanx.report.progress import ProgressReporter
from phalanx.report.run_report import write_environment
from phalanx.report.sink import tensorboard_note
from phalanx.runtime.run import Accumulator, Run
from phalanx.train import checkpointing as ckpt
from phalanx.train.nan_guard import NanGuard, advice, parameters_finite
from phalanx.runtime.optim import adamw
from phalanx.train.watchers import SpikeWatch, StragglerWatch
from phalanx.train.schedule import lr_at


@dataclass
class TrainState:
    step: int = 0  # optimizer steps done
    position: int = 0  # global samples consumed (the data cursor)
    tokens_seen: int = 0


@dataclass
class TrainResult:
    model: nn.Module  # as wrapped by the strategy
    optimizer: torch.optim.Optimizer
    losses: list[float] = field(default_factory=list)  # global mean train loss per step
    val_losses: dict[int, float] = field(default_factory=dict)
    state: TrainState = field(default_factory=TrainState)
    stopped: int = 0  # the signal (SIGINT/SIGTERM) that ended the loop early, or 0
    grad_norms: list = field(default_factory=list)  # per step, before clipping (floats once logged)


def optimizer_step(run: Run, model: nn.Module, opt: torch.optim.Optimizer,
                   grad_clip: float, check=None) -> torch.Tensor | None:
    """Unscale (fp16) → clip (the strategy's: the global norm, sharded or not) → step →
    zero, in that order. Returns the gradient norm before clipping (None: no clipping).

    `check(norm)` (the NaN guard) is asked before stepping; when it says the step is bad
    the gradients are dropped and nothing steps (fp16's scaler skips such steps itself)."""
    scaler = run.precision.scaler
    if scaler is not None:
        scaler.unscale_(opt)
    norm = run.clip_grad_norm_(model, grad_clip) if grad_clip > 0 else None
    if check is not None and scaler is None and check(norm):
        opt.zero_grad(set_to_none=True)
        return norm
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return norm


def _nan_check(guard: NanGuard, loss: torch.Tensor, norm, step: int, model) -> bool:
    """The NaN guard's verdict for this step (every rank the same); says why on rank 0,
    and raises when the run must stop."""
    ranks = guard.bad(loss, norm)
    if ranks is None:
        return False
    what = guard.message(step, ranks, model)
    stop = guard.record(step)
    if guard.mode != "rollback" and len(ranks) == guard.run.world_size and \
            not parameters_finite(guard.run, model):
        stop = (f"the parameters themselves are no longer finite (an earlier update made "
                f"them so): the run diverged; {advice(guard.precision)}.")
    if stop is not None:
        raise UserError(f"{what}; {stop}")
    guard.note(step, "nan", f"{what}; step skipped on every rank ({guard.skipped} so far; "
                            f"--on-nan {guard.mode})")
    return True


def _roll_back(run: Run, cfg: Config, out_dir: Path | None, result: TrainResult,
               precision: Precision, guard: NanGuard, log: Logger) -> None:
    """`--on-nan rollback` after a bad step: every rank reloads the newest committed
    checkpoint; the data goes on from here (past the offending batch)."""
    state = ckpt.roll_back(run, cfg, out_dir, result.model, result.optimizer, precision,
                           result.state.position)
    if state is None:
        return  # no checkpoint yet: the step was skipped, as with --on-nan skip
    stop = guard.rolled_back_to(state.step)
    if stop is not None:
        raise UserError(f"step {result.state.step + 1}: {stop}")
    guard.note(state.step, "rollback", f"rolled back to the checkpoint of step {state.step}; "
                                       f"the data goes on past the offending batch")
    result.state = state
    log.rolled_back()


def micro_steps(model: nn.Module, acc: Accumulator, batches: Iterator, precision: Precision,
                timing=None) -> torch.Tensor:
    """Forward and backward over one accumulation window; returns the mean local loss.
    `timing()`: a context that times data loading and forward (StragglerWatch)."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for _ in range(acc.steps):
        with acc.micro_step():
            with timing() if timing is not None else contextlib.nullcontext():
                x, y = next(batches)
                with precision.autocast():
                    _, loss = model(x, y)
            acc.backward(loss, precision.scaler)
        total += loss.detach().float()
    return total / acc.steps


@torch.no_grad()
def evaluate(run: Run, model: nn.Module, cfg: Config, val: TokenWindows,
             precision: Precision) -> float:
    """Mean validation loss over the same `eval_batches` global batches every time."""
    t = cfg.train
    loader = run.loader(val, t.micro_batch_size, seed=t.seed + 1, stream=True)
    batches = iter(loader)
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=run.device)
    for _ in range(t.eval_batches):
        x, y = next(batches)
        with precision.autocast():
            _, loss = model(x, y)
        total += loss.float()
    model.train(was_training)
    return run.all_reduce_mean(total / t.eval_batches).item()


class Logger:
    """Rank-0 bookkeeping: progress, metrics.jsonl, throughput between log points."""

    def __init__(self, run: Run, cfg: Config, out_dir: Path | None, start_step: int) -> None:
        self.run, self.cfg = run, cfg
        main = run.is_main and out_dir is not None
        if out_dir is not None:  # before the first progress line, once per run
            run.say_once(tensorboard_note())
        self.progress = ProgressReporter(cfg.train.max_steps, start_step) if main else None
        self.out_dir, self.spikes = out_dir, SpikeWatch(cfg.train.spike_factor)
        self.writes = out_dir is not None  # through run.log (rank 0 writes)
        if self.writes:
            run.log_dir = Path(out_dir)
        self.pending: list[torch.Tensor] = []
        self.t_last, self.steps_since = time.perf_counter(), 0
        self.first = start_step + 1  # this process's first step: said at once

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

    def rolled_back(self) -> None:
        """Steps past a rollback's checkpoint are trained again: their losses are not
        reported, and the metrics from that step on are written anew (MetricsSink)."""
        self.pending, self.steps_since = [], 0
        self.t_last = time.perf_counter()
        if self.writes:
            self.run.end_log()

    def step_done(self, loss: torch.Tensor) -> None:
        self.pending.append(loss)
        self.steps_since += 1

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
        record = {"step": step, "loss": sum(mean) / len(mean), "lr": lr,
                  "tokens_per_s": tokens / max(elapsed, 1e-9),
                  "step_time_s": elapsed / max(1, self.steps_since),
                  "memory_mib": peak_memory_mib(self.run.device)}
        norm = _settle_norms(result.grad_norms, self.steps_since)
        if norm is not None:  # the global norm: the same on every rank
            record["grad_norm"] = norm
        if self.progress is not None:
            self.progress.update(step, record["loss"], record["tokens_per_s"], lr)
        self.pending, self.steps_since = [], 0
        return record

    def write(self, record: dict) -> None:
        if self.writes:
            self.run.log(record["step"], reduce=None,
                         **{k: v for k, v in record.items() if k != "step"})
        if self.progress is not None and "val_loss" in record:
            self.progress.message(f"step {record['step']}: val loss {record['val_loss']:.4f}")
        self.t_last = time.perf_counter()

    def close(self) -> None:
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


def peak_memory_mib(device: torch.device) -> float:
    """This process's peak memory: the device's allocator on CUDA, else the resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _report(run: Run, cfg: Config, log: Logger, result: TrainResult, inner: nn.Module,
            val_ds: TokenWindows, precision: Precision, lr: float) -> None:
    """Log and evaluate after a step, when their cadence (or the last step) says so."""
    t, step = cfg.train, result.state.step
    last = step == t.max_steps
    record = None
    if step % t.log_every == 0 or last:
        record = log.flush(step, lr, result)
    if step % t.eval_every == 0 or last:
        record = record or {"step": step}
        run.beat(step, "eval")
        fault_point("eval", step)
        record["val_loss"] = evaluate(run, inner, cfg, val_ds, precision)
        result.val_losses[step] = record["val_loss"]
    if record is not None:
        log.write(record)


def _guard(run: Run, cfg: Config, model: nn.Module, step: int) -> None:
    every = cfg.dist.check_consistency_every
    if every and step % every == 0:
        run.beat(step, "consistency check")
        run.check_consistency(model)


def train(cfg: Config, run: Run, splits: TokenSplits, out_dir: Path | None = None,
          samples: list[int] | None = None) -> TrainResult:
    """Train MiniGPT per `cfg` on this process's `run`; returns the model and losses.

    With `out_dir`, checkpoints are committed there and `--resume` is honoured. With a
    `samples` list, every training sample id this rank reads is appended to it. The
    first SIGINT/SIGTERM ends the loop after the step in progress, with a checkpoint
    (`result.stopped` names the signal); a second one stops the process at once.
    """
    t = cfg.train
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    model, opt = run.setup(build_model(cfg), lambda params: adamw(
        params, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
        device=run.device), precision=t.precision)
    precision = run.precision
    mark("model built and wrapped, optimizer made")
    state = ckpt.restore(run, cfg, out_dir, model, opt, precision) or TrainState()
    mark("resume checked")
    if run.is_main and out_dir is not None:  # (metrics past state.step: see MetricsSink)
        atomic_write(Path(out_dir) / "run_config.json", json.dumps(cfg.to_dict(), indent=2))
        write_environment(run, cfg, Path(out_dir))
    train_ds = TokenWindows(splits.load("train"), cfg.model.block_size)
    if samples is not None:
        train_ds = Recorded(train_ds, samples)
    val_ds = TokenWindows(splits.load("val"), cfg.model.block_size)
    batches = iter(run.loader(train_ds, t.micro_batch_size, seed=t.seed, stream=True,
                              position=state.position))
    result = TrainResult(model=model, optimizer=opt, state=state)
    log = Logger(run, cfg, out_dir, state.step)
    try:
        with run.catch_stop_signals():
            _steps(cfg, run, result, batches, precision, log, val_ds, out_dir)
    finally:
        log.close()
    return result


def _steps(cfg: Config, run: Run, result: TrainResult, batches: Iterator,
           precision: Precision, log: Logger, val_ds: TokenWindows,
           out_dir: Path | None) -> None:
    """The loop: one optimizer step per iteration, until `--max-steps` or a stop signal."""
    t, state, model, opt = cfg.train, result.state, result.model, result.optimizer
    inner = run.unwrap(model)
    step_model = torch.compile(model) if t.compile else model
    acc = run.accumulate(model, t.grad_accum)
    global_batch = t.micro_batch_size * t.grad_accum * run.topology.dp_size
    guard = NanGuard(run, t.on_nan, t.nan_patience, t.precision, out_dir)
    stragglers = StragglerWatch(run, cfg.dist.straggler_every)
    while result.state.step < t.max_steps:
        state = result.state  # (a rollback replaces it)
        step = state.step
        run.seed_step(step)
        lr = lr_at(step, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps,
                   max_steps=cfg.decay_steps())
        for group in opt.param_groups:
            group["lr"] = lr
        loss = micro_steps(step_model, acc, batches, precision,
                           lambda: stragglers.timing(step))
        run.checkpoint_staged()  # a background save's copy must be done before the step
        skipped_before = guard.skipped
        result.grad_norms.append(optimizer_step(
            run, model, opt, t.grad_clip,
            check=lambda norm: _nan_check(guard, loss, norm, step + 1, inner)))
        if guard.skipped > skipped_before:  # counted for throughput, not averaged in
            log.steps_since += 1
            if guard.mode == "rollback":
                _roll_back(run, cfg, out_dir, result, precision, guard, log)
                state = result.state
                if state.step < step:
                    continue
        else:
            log.step_done(loss)
        state.step, state.position = step + 1, state.position + global_batch
        state.tokens_seen += global_batch * cfg.model.block_size
        fault_point("step", state.step, inner)
        run.beat(state.step, "train")
        if log.step_ended(state.step):
            mark("first optimizer step done")
        _guard(run, cfg, model, state.step)
        slow = stragglers.check(state.step)
        if slow:
            warn(run, out_dir, "straggler", state.step, slow)
        _report(run, cfg, log, result, inner, val_ds, precision, lr)
        result.stopped = run.stop_requested()  # every rank agrees to stop at this step
        if out_dir is not None and (ckpt.should_save(cfg, state.step) or result.stopped):
            ckpt.save(run, cfg, out_dir, state, model, opt, precision)
        if result.stopped:
            break
    run.wait_checkpoint()
