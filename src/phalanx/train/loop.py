"""The built-in trainer, written on the public `Run` API (setup, loader, accumulate,
all-reduce, print) — the same calls a user's own script makes.

One optimizer step = `grad_accum` micro-steps on every rank; only the last micro-step
synchronises gradients. Randomness is re-seeded at every micro-step from (seed, step,
micro-step, rank) (`run.accumulate`), and the data cursor is a global sample position, so
a run's trajectory is a function of its config alone.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn

from phalanx.cluster.faults import fault_point
from phalanx.cluster.startup_trace import mark
from phalanx.config.fields import step_range
from phalanx.config.sections import Config
from phalanx.data import TokenSplits, TokenWindows
from phalanx.data.dataset import Recorded
from phalanx.data.stream_loader import loader_for
from phalanx.errors import UserError
from phalanx.ft.gate import QuorumBatches, step_gate
from phalanx.models import build_model
from phalanx.paths import RunDir, atomic_write
from phalanx.report.run_report import write_environment
from phalanx.runtime.optim import make_optimizer
from phalanx.runtime.profiling import StepProfiler
from phalanx.runtime.run import Run
from phalanx.runtime.train_step import micro_steps, optimizer_step, pipeline_steps
from phalanx.strategies.precision import Precision
from phalanx.train import checkpointing as ckpt
from phalanx.train.logger import Logger
from phalanx.train.nan_guard import NanGuard, advice, parameters_finite
from phalanx.train.schedule import lr_at
from phalanx.train.state import TrainResult, TrainState


def train(cfg: Config, run: Run, splits: TokenSplits, out_dir: RunDir | Path | None = None,
          samples: list[int] | None = None, gate: Any = None,
          verified: str | None = None) -> TrainResult:
    """Train MiniGPT per `cfg` on this process's `run`; returns the model and losses.

    With `out_dir`, checkpoints are committed there and `--resume` is honoured. With a
    `samples` list, every training sample id this rank reads is appended to it. The
    first SIGINT/SIGTERM ends the loop after the step in progress, with a checkpoint
    (`result.stopped` names the signal); a second one stops the process at once.
    `gate`: what runs around each step (default: torchft's `ReplicaGroup` in a replica
    group of `--fault-tolerance torchft`, else nothing; see phalanx.ft.replica).
    `verified`: the checkpoint the launcher verified in full (its job's token).
    """
    t = cfg.train
    out_dir = None if out_dir is None else RunDir(out_dir)
    if out_dir is not None:  # the verbs made it (`prepare_out_dir`); a library call may not
        out_dir.root.mkdir(parents=True, exist_ok=True)
    net = build_model(cfg, splits.vocab_size)
    model, opt = run.setup(net, lambda params: make_optimizer(cfg, net, params, run.device,
                                                              splits.vocab_size),
                           precision=t.precision)
    precision = run.precision
    assert precision is not None  # set by run.setup
    mark("model built and wrapped, optimizer made")
    corpus = splits.corpus_record()  # what the data cursor counts in
    state = ckpt.restore(run, cfg, out_dir, model, opt, precision, corpus, verified)
    if state is None and cfg.model.init_from:  # a fresh start from a Hugging Face model
        _start_from(run, cfg, model)
    state = state or TrainState()
    state.corpus = corpus
    mark("resume checked")
    if run.is_main and out_dir is not None:  # (metrics past state.step: see MetricsSink)
        _write_run_files(cfg, run, splits, out_dir)
    train_ds = TokenWindows(splits.load("train"), cfg.model.block_size)
    if samples is not None:
        train_ds = Recorded(train_ds, samples)
    val_ds = TokenWindows(splits.load("val"), cfg.model.block_size)
    if gate is None:  # torchft or not
        gate = step_gate(run, cfg, None if out_dir is None else out_dir.root)
    batches: Iterator = QuorumBatches(train_ds, t.micro_batch_size, t.seed, run.device) \
        if gate.aims_batches else iter(run.loader(
            train_ds, t.micro_batch_size, seed=t.seed, stream=True, position=state.position))
    result = TrainResult(model=model, optimizer=opt, state=state,
                         token_bytes=_token_bytes(splits, run.device),
                         tokenizer=splits.tokenizer_record())
    gate.attach(result)
    log = Logger(run, cfg, out_dir, state.step)
    profiler = _profiler(cfg, run, out_dir, state.step)
    try:
        with run.catch_stop_signals():
            _steps(cfg, run, result, batches, precision, log, val_ds, out_dir, gate, profiler)
        if profiler is not None:  # stopped inside the range (every rank at one step)
            profiler.close(result.state.step)
    finally:
        if profiler is not None:
            profiler.abandon()  # an exception: stop recording, write nothing
        log.close()
        gate.shutdown()
    return result


def _write_run_files(cfg: Config, run: Run, splits: TokenSplits, out_dir: RunDir) -> None:
    """Rank 0, at the start: the config, the tokenizer (`phalanx export` of a checkpoint
    copies it) and the environment, in the run directory."""
    atomic_write(out_dir.run_config, json.dumps(cfg.to_dict(), indent=2))
    splits.export_tokenizer(out_dir.root)
    write_environment(run, cfg, out_dir.root)


def _profiler(cfg: Config, run: Run, out_dir: RunDir | None, step: int
              ) -> StepProfiler | None:
    """`--profile-steps A-B`'s profiler, writing to OUT/profile (None: not asked for)."""
    t = cfg.train
    if not t.profile_steps or out_dir is None:
        return None
    return StepProfiler(run, step_range(t.profile_steps, "--profile-steps"), out_dir.profile,
                        step, t.max_steps)


def _token_bytes(splits: TokenSplits, device: torch.device) -> torch.Tensor | None:
    """Each token id's length in bytes (None: unknown, e.g. bare token ids)."""
    found = splits.token_bytes()
    return None if found is None else torch.as_tensor(found, dtype=torch.float64, device=device)


def _steps(cfg: Config, run: Run, result: TrainResult, batches: Iterator,
           precision: Precision, log: Logger, val_ds: TokenWindows,
           out_dir: RunDir | None, gate: Any, profiler: StepProfiler | None) -> None:
    """The loop: one optimizer step per iteration, until `--max-steps` or a stop signal.
    `gate`: torchft's quorum, gradient average and commit vote around each step (a no-op
    without `--fault-tolerance`)."""
    t, model, opt = cfg.train, result.model, result.optimizer  # model: as wrapped
    inner = run.unwrap(model)  # the user's module: evaluation, fault hooks, NaN messages
    window = _window(cfg, run, model, batches, precision)
    guard = NanGuard(run, t.on_nan, t.nan_patience, t.precision, out_dir)
    roll_back = functools.partial(_roll_back, run, cfg, out_dir, result, precision, guard,
                                  log, gate)  # (--on-nan rollback, after a dropped step)
    if run.pace is not None:  # a straggler's warning is an event of the run
        run.pace.events_dir = out_dir
    after_step = _after_step_checks(cfg, run, log, model, inner)
    if profiler is not None:  # last: the checks' time is the step's
        after_step.append(profiler.after)
    while result.state.step < t.max_steps:
        gate.begin_step(batches)  # torchft: the quorum (a returning group is healed here)
        step = result.state.step
        if gate.healed:
            log.rebase(step)
        if step >= t.max_steps:
            break  # healed to the end
        began = time.perf_counter()  # (goodput: the step's own time, not the quorum's)
        run.at_step(step, gate.rank)  # what the micro-steps seed from: exact on resume
        lr = _set_lr(cfg, opt, step)
        loss = window()  # the accumulation window's forward and backward
        loss = gate.average(model, loss)  # torchft: over the live groups (with the loss)
        if not gate.commit():  # torchft: a group failed during this step: do it again
            opt.zero_grad(set_to_none=True)
            continue
        global_batch = gate.global_batch
        run.checkpoint_staged()  # a background save's copy must be done before the step
        done = optimizer_step(run, model, opt, t.grad_clip,  # the NaN guard asked first
                              check=functools.partial(_nan_check, guard, loss,
                                                      step=step + 1, model=inner))
        result.grad_norms.append(done.norm)
        log.step_done(loss, time.perf_counter() - began,  # a dropped step counts for
                      skipped=done.dropped)  # throughput
        if done.dropped and guard.mode == "rollback" and roll_back():
            continue  # on from the checkpoint's step, the data past the bad batch
        state = result.state  # (a rollback to this very step replaced it)
        state.step, state.position = step + 1, state.position + global_batch
        state.tokens_seen += global_batch * cfg.model.block_size
        gate.stepped(inner)
        for check in after_step:
            check(state.step)
        _report(run, cfg, log, result, inner, val_ds, precision, lr, gate.val_world)
        result.stopped = gate.stop(run)  # every rank (and replica group) agrees to stop here
        if out_dir is not None and (ckpt.should_save(cfg, state.step) or result.stopped):
            ckpt.save(run, cfg, out_dir, state, model, opt, precision, result.tokenizer)
            log.ledger.reached(state.step, "saved")
        if result.stopped:
            break
    run.wait_checkpoint()


def _window(cfg: Config, run: Run, model: nn.Module, batches: Iterator,
            precision: Precision) -> Callable[[], torch.Tensor]:
    """One accumulation window's forward and backward, returning its mean loss: through
    the pipeline schedule under `--pp`, else the micro-steps (of the compiled model with
    `--compile`: the same weights)."""
    t = cfg.train
    if run.topology.pp_mesh is not None:
        return functools.partial(pipeline_steps, run, model, batches, t.grad_accum,
                                 cfg.dist.pp_schedule)
    # on a Module torch.compile returns an OptimizedModule, which torch's stubs type as a
    # plain Callable
    forward = cast(nn.Module, torch.compile(model)) if t.compile else model
    return functools.partial(micro_steps, forward, run.accumulate(model, t.grad_accum),
                             batches, precision)


def _after_step_checks(cfg: Config, run: Run, log: Logger, model: nn.Module,
                       inner: nn.Module) -> list[Callable[[int], None]]:
    """What every rank does after each optimizer step (given the step just done), in this
    order: a planted fault (PHALANX_FAULT), the hang watchdog's beat, the start-up's end
    (once) and the replicas' consistency check — a collective, made at the same steps on
    every rank. (The straggler check is `run.step`'s: runtime.pace.)"""
    every = cfg.dist.check_consistency_every

    def first_step(step: int) -> None:
        if log.step_ended(step):
            mark("first optimizer step done")

    def consistency(step: int) -> None:
        if every and step % every == 0:
            run.beat(step, "consistency check")
            with run.waiting():
                run.check_consistency(model)

    return [lambda step: fault_point("step", step, inner),
            lambda step: run.beat(step, "train"),
            first_step, consistency]


def _set_lr(cfg: Config, opt: torch.optim.Optimizer, step: int) -> float:
    """Set the learning rate of `step` (a function of the step alone) on every group."""
    t = cfg.train
    lr = lr_at(step, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps,
               max_steps=cfg.decay_steps(), schedule=t.lr_schedule,
               decay_fraction=t.decay_fraction)
    for group in opt.param_groups:
        group["lr"] = lr
        if group.get("use_muon"):  # (a resumed optimizer's groups hold the saved ratio)
            group["lr_scale"] = t.muon_lr / t.lr
    return lr


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


def _roll_back(run: Run, cfg: Config, out_dir: RunDir | None, result: TrainResult,
               precision: Precision, guard: NanGuard, log: Logger, gate: Any) -> bool:
    """`--on-nan rollback` after a bad step: every rank reloads the newest committed
    checkpoint; the data goes on from here (past the offending batch). True when that
    checkpoint is of an earlier step: the loop goes on from there, the bad batch counted
    as read (not read again) and torchft's step counter following (`gate`)."""
    step = result.state.step
    state = ckpt.roll_back(run, cfg, out_dir, result.model, result.optimizer, precision,
                           result.state.position)
    if state is None:
        return False  # no checkpoint yet: the step was skipped, as with --on-nan skip
    stop = guard.rolled_back_to(state.step)
    if stop is not None:
        raise UserError(f"step {result.state.step + 1}: {stop}")
    guard.note(state.step, "rollback", f"rolled back to the checkpoint of step {state.step}; "
                                       f"the data goes on past the offending batch")
    result.state = state
    log.rolled_back(state.step)
    if state.step >= step:
        return False
    state.position += gate.global_batch
    gate.rolled_back(state)
    return True


def _report(run: Run, cfg: Config, log: Logger, result: TrainResult, inner: nn.Module,
            val_ds: TokenWindows, precision: Precision, lr: float,
            val_world: int | None = None) -> None:
    """Log and evaluate after a step, when their cadence (or the last step) says so
    (`val_world`: see `evaluate`)."""
    t, step = cfg.train, result.state.step
    last = step == t.max_steps
    record = None
    if step % t.log_every == 0 or last:
        record = log.flush(step, lr, result)
    if t.eval_every and (step % t.eval_every == 0 or last):  # 0: never
        record = record or {"step": step}
        run.beat(step, "eval")
        fault_point("eval", step)
        record["val_loss"], per_byte = evaluate(run, inner, cfg, val_ds, precision,
                                                result.token_bytes, val_world)
        result.val_losses[step] = record["val_loss"]
        if per_byte is not None:
            record["val_nats_per_byte"] = result.val_nats_per_byte[step] = per_byte
    if record is not None:
        log.write(record)


@torch.no_grad()
def evaluate(run: Run, model: nn.Module, cfg: Config, val: TokenWindows,
             precision: Precision, token_bytes: torch.Tensor | None = None,
             world: int | None = None) -> tuple[float, float | None]:
    """Validation loss over the same `eval_batches` global batches every time: the mean
    per token (nats/token), and — given each token id's length in bytes — the same
    losses' total over the text's bytes (nats/byte: what compares tokenizers). Each rank
    evaluates its share and the sums are all-reduced; with `world`, this process
    evaluates every share of a data-parallel world of that size itself, summed in rank
    order (a torchft replica group: the val loss of the ddp run on as many ranks as the
    launch has groups, with no collective outside a step's quorum)."""
    t = cfg.train
    if world is None:
        loaders = [run.loader(val, t.micro_batch_size, seed=t.seed + 1, stream=True)]
    else:
        options = {"shuffle": None, "seed": t.seed + 1, "stream": True, "position": 0}
        loaders = [loader_for(val, t.micro_batch_size, device=run.device, dp_rank=r,
                              dp_size=world, seed=run.seed, all_have=None,
                              sampler_options=options) for r in range(world)]
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, device=run.device, dtype=torch.float64)
    loss_of = ((lambda x, y: run.eval_loss(model, x, y)) if run.topology.pp_mesh is not None
               else (lambda x, y: model(x, y)[1]))  # (pipeline stages: the schedule's eval)
    for loader in loaders:
        with run.strategy.loss_context():  # (tensor parallelism: the loss on the shards)
            _add_val_sums(sums, loss_of, iter(loader), t.eval_batches, precision, token_bytes)
    model.train(was_training)
    if world is None:
        sums = run.all_reduce_sum(sums)
    per_byte = (sums[0] / sums[2]).item() if token_bytes is not None else None
    return (sums[0] / sums[1]).item(), per_byte


def _add_val_sums(sums: torch.Tensor, loss_of: Callable, batches: Iterator, count: int,
                  precision: Precision, token_bytes: torch.Tensor | None) -> None:
    """Add to `sums`, over `count` batches of one share: the loss (`loss_of(x, y)`, a
    batch's mean) summed over tokens, the tokens, their bytes."""
    for _ in range(count):
        x, y = next(batches)
        with precision.autocast():
            loss = loss_of(x, y)
        sums[0] += loss.double() * y.numel()
        sums[1] += y.numel()
        if token_bytes is not None:
            sums[2] += token_bytes[y.to(token_bytes.device)].sum()


def _start_from(run, cfg: Config, model) -> None:
    """`--init-from DIR`: `--model`'s class by its own names, or MiniGPT from GPT-2's."""
    where = cast(str, cfg.model.init_from)
    if cfg.model.factory is not None:
        run.load_pretrained(model, where)
    else:
        from phalanx.checkpoint.gpt2 import load_gpt2

        note = load_gpt2(model, where, cfg.model)
        if note:
            run.print(f"phalanx: note: {note}")
    run.print(f"started from the weights of {where}")
