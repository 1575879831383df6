"""The trainer's checkpoints: what goes in them, and resuming exactly from one.

A checkpoint holds the model, the optimizer, the GradScaler (fp16), the step, the
global data cursor and the tokens seen. Nothing else is needed for an exact
continuation: the learning rate is a function of the step, dropout is seeded from
(seed, step, micro-step, rank), and data order from (seed, epoch, position).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.checkpoint.resume import checkpoints_dir, newest_valid, resolve_resume
from phalanx.checkpoint.rundir import reconcile
from phalanx.checkpoint.store import read_sidecar
from phalanx.cluster.protocol import in_replica_group
from phalanx.cluster.rendezvous import restart_note
from phalanx.config.sections import Config
from phalanx.errors import UserError
from phalanx.paths import RunDir
from phalanx.report.events import record_event
from phalanx.report.metrics import read_metrics
from phalanx.runtime.world_change import written_by
from phalanx.train.changes import (
    ORIGINAL_SHAPE,
    SAVED_BEFORE,
    SHAPE_FIELDS,
    check_compatible,
)
from phalanx.train.nan_guard import advice, parameters_finite
from phalanx.train.state import TrainState

if TYPE_CHECKING:
    from phalanx.runtime.run import Run
    from phalanx.strategies.precision import Precision


def config_hash(cfg: Config) -> str:
    shape = {k: getattr(cfg.model, k) for k in SHAPE_FIELDS  # options added later count
             if k in ORIGINAL_SHAPE or getattr(cfg.model, k) != SAVED_BEFORE[k]}  # when set
    if cfg.model.factory is not None:  # (MiniGPT runs keep the hash they always had)
        shape["factory"] = cfg.model.factory
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def save(run: Run, cfg: Config, out_dir: RunDir | Path, state: TrainState, model, opt,
         precision: Precision, tokenizer: dict | None = None) -> None:
    """Commit a checkpoint of `state.step` — never one whose parameters are not finite
    (the run diverged: a UserError saying so, and the last good checkpoint stays)."""

    if not parameters_finite(run, model):
        raise UserError(f"the parameters are not finite at step {state.step}: the run "
                        f"diverged, so no checkpoint of it is committed (the newest "
                        f"committed one is kept); {advice(cfg.train.precision)}.")
    meta = {"train_state": dataclasses.asdict(state), "config": cfg.to_dict(),
            "scaler": precision.scaler.state_dict() if precision.scaler else None,
            "world_size": run.world_size, "strategy": run.strategy.label,
            "vocab_size": _vocab_size(run, model), "tokenizer": tokenizer}
    run.save(checkpoints_dir(out_dir), state.step, model, opt, meta,
             keep=cfg.train.keep_checkpoints, config_hash=config_hash(cfg),
             asynchronous=cfg.train.async_checkpoint, overlap_staging=True)


def _vocab_size(run: Run, model) -> int | None:
    """The vocabulary the model was built for (`phalanx export` rebuilds it so)."""
    inner = run.unwrap(model)
    vocab = getattr(type(inner), "phalanx_vocab", None)  # a factory's (models.adapter)
    config = getattr(inner, "config", None)
    return vocab if vocab is not None else getattr(config, "vocab_size", None)


def precheck(cfg: Config, out_dir: RunDir | Path, tokenizer: dict | None = None,
             corpus: dict | None = None) -> tuple[Path | None, str | None]:
    """Before any worker starts: the checkpoint `--resume` would pick must exist, verify
    and fit the model, the tokenizer and the corpus (`TokenSplits`' records, when given;
    UserError otherwise). Rank 0 repeats the choice and its warnings.

    Returns that checkpoint (None: a fresh start) and, when it is already at (or past)
    `--max-steps`, a one-line account: the run is complete, nothing to do."""
    path = resolve_resume(cfg.train.resume, out_dir, lambda message: None)
    if path is None:
        return None, None
    meta = read_sidecar(path)["meta"]
    check_compatible(cfg, meta, path, tokenizer=tokenizer, corpus=corpus)
    step = int(meta.get("train_state", {}).get("step", 0))
    if step < cfg.train.max_steps:
        return path, None
    reached = last_val_loss(Path(out_dir), step)
    where = (f"at step {step} of {cfg.train.max_steps}" if step == cfg.train.max_steps
             else f"at step {step}, past `--max-steps` {cfg.train.max_steps}")
    return path, (f"the run in `{out_dir}` is already complete: checkpoint {path.name} is "
                  f"{where}" + (f", val loss {reached:.4f}" if reached is not None else "")
                  + ". Nothing to do (nothing written): raise `--max-steps` to train "
                    "further, or start over with `--resume never`.")


def last_val_loss(out_dir: RunDir | Path, step: int,
                  key: str = "val_loss") -> float | None:
    """The newest validation loss (`key`: or `val_nats_per_byte`) `metrics.jsonl` holds at
    or before `step` (None: none)."""
    path = RunDir(out_dir).metrics
    if not path.is_file():
        return None
    losses = [float(r[key]) for r in read_metrics(path)
              if type(r.get(key)) in (int, float)  # a torn or odd record: not a loss
              and type(r.get("step")) is int and r["step"] <= step]
    return losses[-1] if losses else None


def start_lineage(out_dir: RunDir | Path, resume_from: Path | None, say) -> None:
    """Make `OUT/checkpoints` the lineage that continues from `resume_from` (precheck's
    choice; see checkpoint.rundir): on a fresh start the previous run moves to
    `OUT/superseded/`. Lock holder only."""
    reconcile(out_dir, resume_from, say)


def restore(run: Run, cfg: Config, out_dir: RunDir | Path | None, model, opt,
            precision: Precision, corpus: dict | None = None,
            verified: str | None = None) -> TrainState | None:
    """Load the checkpoint `--resume` selects (same choice on every rank), or None.
    `corpus`: this run's (`TokenSplits.corpus_record`), checked against the checkpoint's;
    `verified`: the launcher's token for the checkpoint it verified in full (the job's)."""
    if out_dir is None:
        return None
    path = None
    if run.is_main:
        path = resolve_resume(cfg.train.resume, out_dir, run.print, verified)
        if not (path is None and in_replica_group()):  # a torchft group restarted with no
            reconcile(out_dir, path, run.print)  # checkpoint heals from a live one: its
            # history stays (else: a no-op after the CLI's start_lineage)
    path = run.broadcast(path)
    restart = restart_note()  # after a restart: which rank died, in the same line
    if path is None:
        if restart:
            run.print(f"phalanx: {restart}; " + (
                "this replica group has no checkpoint yet: it rejoins the live groups and "
                "copies their state" if in_replica_group() else
                "no checkpoint was committed yet: every rank starts again from step 0"))
            if run.is_main:
                record_event(out_dir, "restart", 0, f"{restart}; started again from step 0")
        return None
    meta = read_sidecar(path)["meta"]
    changes = check_compatible(cfg, meta, path, run.topology.dp_size, corpus=corpus)
    state = _load(run, path, meta, model, opt, precision)
    wrote = written_by(meta.get("world_size"), meta.get("strategy", "ddp/single"),
                       run.world_size, run.strategy.label)
    line = (f"resumed from {path} at step {state.step} ({wrote})"
            + (f"; changed: {', '.join(changes)}" if changes else ""))
    run.print(f"phalanx: {restart}; every rank {line}" if restart else line)
    if restart and run.is_main:
        record_event(out_dir, "restart", state.step,
                     f"{restart}; resumed from {Path(path).name} at step {state.step}")
    return state


def roll_back(run: Run, cfg: Config, out_dir: RunDir | Path | None, model, opt,
              precision: Precision, position: int) -> TrainState | None:
    """Every rank: reload the newest committed checkpoint (None when there is none), its
    data cursor set to `position` (the loader reads on; the loop counts the failed batch
    when it goes back to an earlier step), so the batch that failed is not read again."""
    if out_dir is None:
        return None
    run.wait_checkpoint()  # a background save in flight is committed first
    path = newest_valid(checkpoints_dir(out_dir), run.print) if run.is_main else None
    path = run.broadcast(path)
    if path is None:
        return None
    state = _load(run, path, read_sidecar(path)["meta"], model, opt, precision)
    state.position = position
    return state


def _load(run: Run, path: Path, meta: dict, model, opt, precision: Precision) -> TrainState:
    """Load the checkpoint at `path` (its sidecar's `meta`) into the model, optimizer and
    scaler; its training state."""
    run.load(path, model, opt)
    if precision.scaler is not None and meta.get("scaler"):
        precision.scaler.load_state_dict(meta["scaler"])
    return TrainState(**meta["train_state"])


def should_save(cfg: Config, step: int) -> bool:
    every = cfg.train.checkpoint_every
    return step == cfg.train.max_steps or (every > 0 and step % every == 0)
