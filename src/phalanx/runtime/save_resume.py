"""`Run`'s checkpoint methods: save, load, and the two-line resume of a user's script.

What a script's checkpoint holds besides the model and optimizer (in its `meta`, under
keys of Phalanx's own): the loader's global cursor (`loader=`), so the resumed loop gets
the very next batch at any world size, the fp16 loss scaler's state, and the world that
wrote it (ranks, data-parallel ranks, strategy: `run.resume` says what a resume on
another one changes, as `phalanx train` does). `run.resume`
loads the newest committed checkpoint and returns the step to continue from.

Under `phalanx run` (PHALANX_RUN_DIR set) the first `save` or `resume` makes the script's
`run.save` its stop point: a first Ctrl-C/SIGTERM/SIGUSR1 is a request; the next `save`
commits, then every rank exits with 128 + the signal (130 for Ctrl-C), and the launcher
prints the resume command. A second signal more than 2 s later stops at once.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from phalanx.checkpoint.export import MODEL_KEY, model_recipe
from phalanx.checkpoint.resume import newest_valid
from phalanx.checkpoint.rundir import step_of
from phalanx.checkpoint.saver import CheckpointSaver
from phalanx.checkpoint.store import load_checkpoint, param_groups
from phalanx.cluster import protocol
from phalanx.cluster.lifecycle import StopSignals, exit_code
from phalanx.errors import UserError
from phalanx.runtime import user_loader
from phalanx.runtime.clip_and_step import SEEDING
from phalanx.runtime.stateful import record as stateful_record
from phalanx.runtime.stateful import restore as restore_stateful
from phalanx.runtime.world_change import WORLD_KEY, script_resume, world_record

LOADER_KEY = "phalanx.loader"  # in a checkpoint's meta: the loader's cursor
SCALER_KEY = "phalanx.scaler"  # the fp16 loss scaler's state
SEEDING_KEY = "phalanx.seeding"  # how the run that wrote it seeded (stepping.SEEDING)


class CheckpointMethods:
    """Mixed into `Run` (which provides strategy, precision, print, broadcast, ...)."""

    _saver: Any
    _stop: Any
    _stops_at_save: bool
    strategy: Any
    topology: Any
    precision: Any
    loss_scaler: Any  # (StepMethods)
    optimizer_steps: int

    if TYPE_CHECKING:  # provided by Run
        @property
        def is_main(self) -> bool: ...
        def broadcast(self, obj: Any, src: int = 0) -> Any: ...
        def stop_requested(self) -> int: ...
        def print(self, *args: Any, **kwargs: Any) -> None: ...
        def close(self, failed: bool = False) -> None: ...
        def say_once(self, text: str | None) -> None: ...
        def at_step(self, step: int, rank: int | None = None) -> None: ...

    def save(self, root: str | Path, step: int, model: nn.Module,
             optimizer: torch.optim.Optimizer | None = None, meta: dict | None = None, *,
             loader: Any = None, stateful: dict[str, Any] | None = None, keep: int = 3,
             config_hash: str = "", asynchronous: bool = False,
             overlap_staging: bool = False) -> Path:
        """Commit checkpoint `step` under `root` (call on every rank; see checkpoint.saver).

        `step`: the optimizer steps done — what `resume` returns. `loader`: a
        `run.loader` whose cursor is committed with it (exact resume of the data).
        `stateful`: {name: object with state_dict()/load_state_dict()} — an LR scheduler —
        whose states go in the checkpoint as JSON (`runtime.stateful`). The
        fp16 loss scaler's state is saved when there is one, and a transformers model's
        class and config (`phalanx export` then rebuilds it from the checkpoint). Tensors go through
        torch.distributed.checkpoint; `meta` must be JSON-able. With `asynchronous=True`
        it returns once the state is copied to memory; the write and the commit go on in
        a background thread (the next `save` or `wait_checkpoint` waits for it, and
        raises its error on every rank). `overlap_staging=True` also copies parameters
        and optimizer state in the background, during the next forward/backward: call
        `checkpoint_staged()` before the next optimizer step.
        """
        self._stop_point()
        meta = {**(meta or {}), **self._extras(loader), **stateful_record(stateful)}
        recipe = model_recipe(self.strategy.unwrap(model))
        if recipe is not None:  # `phalanx export` can rebuild it from the checkpoint alone
            meta[MODEL_KEY] = recipe
        deferred = None
        if overlap_staging:
            deferred = {n for n, _ in self.strategy.unwrap(model).named_parameters()}
        path = self._checkpoints().save(
            Path(root), step, lambda: self.strategy.save_state(model, optimizer),
            param_groups(optimizer), meta, keep=keep, config_hash=config_hash,
            asynchronous=asynchronous, deferred=deferred)
        self._stop_if_asked(path)
        return path

    def resume(self, root: str | Path, model: nn.Module,
               optimizer: torch.optim.Optimizer | None = None, *, loader: Any = None,
               stateful: dict[str, Any] | None = None) -> int:
        """Load the newest committed checkpoint under `root` into `model`, `optimizer`,
        `loader` (its cursor), `stateful`'s objects (as `save` took them) and the loss
        scaler; return the step to continue from
        (the `step` it was saved with), or 0 when there is none — also the optimizer
        step `run.accumulate`'s micro-steps seed from next. A collective."""
        self._stop_point()
        path = self.latest_checkpoint(root)
        step = 0 if path is None else step_of(path)
        self.at_step(step)
        if path is None:
            return 0
        meta = self._load(path, model, optimizer)
        self._restore_extras(meta, loader, path)
        restore_stateful(stateful, meta, path, lambda line: self.print(line, file=sys.stderr))
        batches = None if loader is None or user_loader.is_user_loader(loader) else (
            meta[LOADER_KEY].get("global_batch", 0), loader.sampler.batch_size)
        t = self.topology
        self.print(f"phalanx: resumed from {path} (step {step})" + script_resume(
            meta, t.world_size, t.dp_size, self.strategy.label, batches))
        return step

    def load(self, path: str | Path, model: nn.Module,
             optimizer: torch.optim.Optimizer | None = None) -> dict:
        """Load a checkpoint written at any world size by any strategy; returns the `meta`
        given to `run.save` (Phalanx's own `phalanx.*` entries left out). A collective:
        call it on every rank. One written before the micro-steps were seeded as they
        are now (`SEEDING`) is said in one line."""
        meta = self._load(path, model, optimizer)
        return {k: v for k, v in meta.items() if not k.startswith("phalanx.")}

    def _load(self, path: str | Path, model: nn.Module,
              optimizer: torch.optim.Optimizer | None) -> dict:
        """`load`, returning the whole meta (Phalanx's entries too)."""
        meta = load_checkpoint(Path(path), model, optimizer, self.strategy.load_template,
                               self.strategy.apply_state)
        if meta.get(SEEDING_KEY) != SEEDING:
            self.say_once(f"phalanx: checkpoint {Path(path).name} predates the seeding of "
                          f"each micro-step from {SEEDING}: from here on, random draws "
                          f"(dropout) differ from those the run that wrote it would have "
                          f"made; this run continues exactly from now on.")
        return meta

    def latest_checkpoint(self, root: str | Path) -> Path | None:
        """The newest checkpoint under `root` that verifies, as rank 0 found it."""
        found = newest_valid(Path(root), self.print) if self.is_main else None
        return self.broadcast(found)

    @property
    def checkpoint_timings(self) -> dict[str, float]:
        """Seconds spent by the newest save: begin, state_dict, stall, write, commit, ..."""
        return {} if self._saver is None else dict(self._saver.last_timings)

    def checkpoint_staged(self) -> None:
        """Block until a background save's copy of the state is complete (no collective):
        after it, the model and optimizer may change. Cheap when nothing is pending."""
        if self._saver is not None:
            self._saver.staged()

    def poll_checkpoint(self) -> bool:
        """True when no background save is in flight on this rank (no collective)."""
        return self._saver is None or self._saver.poll()

    def wait_checkpoint(self) -> None:
        """Finish and commit the background save, or raise its error (a collective)."""
        if self._saver is not None:
            self._saver.wait()

    def _checkpoints(self) -> CheckpointSaver:
        if self._saver is None:
            self._saver = CheckpointSaver()
        return self._saver

    # -- what a script's checkpoint holds besides tensors -------------------------------
    def _extras(self, loader: Any) -> dict[str, Any]:
        t = self.topology
        extras: dict[str, Any] = {SEEDING_KEY: SEEDING, WORLD_KEY: world_record(
            t.world_size, t.dp_size, self.strategy.label)}
        if loader is not None and user_loader.is_user_loader(loader):
            extras[user_loader.KEY] = user_loader.record(self, loader)  # every rank's
        elif loader is not None:
            if not hasattr(loader, "state_dict") or not hasattr(loader, "position"):
                raise UserError(f"run.save(loader=...) takes `run.loader(...)`'s loader or "
                                f"one with state_dict() and load_state_dict() (torchdata's "
                                f"StatefulDataLoader); got {type(loader).__name__}.")
            extras[LOADER_KEY] = loader.state_dict()
        scaler = self.loss_scaler
        if scaler is not None:
            extras[SCALER_KEY] = scaler.state_dict()
        return extras

    def _restore_extras(self, meta: dict, loader: Any, path: Path) -> None:
        key = user_loader.KEY if user_loader.is_user_loader(loader) else LOADER_KEY
        if loader is not None and key == user_loader.KEY and key in meta:
            user_loader.restore(self, loader, meta[key], f"checkpoint `{path}`")
        elif loader is not None:
            if key not in meta:
                raise UserError(
                    f"checkpoint `{path}` holds no data position (it was saved without "
                    f"`loader=`), so the loader would start the data over. Pass the same "
                    f"`loader=` to run.save, or resume without `loader=` to start the "
                    f"data over knowingly.")
            loader.load_state_dict(meta[LOADER_KEY], where=f"checkpoint `{path}`")
        scaler = self.loss_scaler
        if scaler is not None and meta.get(SCALER_KEY):
            scaler.load_state_dict(meta[SCALER_KEY])

    # -- stopping at a save point (under `phalanx run`) ----------------------------------
    def _stop_point(self) -> None:
        """Under `phalanx run`, the script's saves become where a stop signal commits
        (unless the caller handles stops itself: `catch_stop_signals`, the trainer)."""
        if self._stop is None and os.environ.get(protocol.RUN_DIR):
            self._stop = StopSignals(on_request=self._stop_acknowledged).install()
            self._stops_at_save = True

    def _stop_acknowledged(self, signum: int) -> None:
        """Said at once (rank 0), when the first stop signal arrives: what happens next."""
        name = signal.Signals(signum).name
        self.print(f"phalanx: {name}: stopping at the script's next run.save (it commits a "
                   f"checkpoint, then every rank exits); another {name} more than "
                   f"{StopSignals.GRACE_S:g} s from now stops at once", file=sys.stderr)

    def _stop_unanswered(self) -> None:
        """At a normal end (`close`): a stop was asked, and the script finished before its
        next `run.save` — said, so that the run is known finished, not stopped."""
        if self._stops_at_save and self._stop is not None and self._stop.requested:
            name = signal.Signals(self._stop.requested).name
            self.print(f"phalanx: {name}: the script finished before its next run.save; "
                       f"nothing was left to stop", file=sys.stderr)
            self._stops_at_save = False

    def _stop_if_asked(self, path: Path) -> None:
        if not self._stops_at_save:
            return
        signum = self.stop_requested()
        if not signum:
            return
        self.wait_checkpoint()  # an asynchronous save: committed before leaving
        self._stops_at_save = False  # answered
        if not protocol.phalanx_worker():  # Phalanx's launcher says it, with the resume
            name = signal.Signals(signum).name  # command: not twice
            self.print(f"phalanx: {name}: checkpoint {path.name} is committed; stopping.")
        self.close()
        raise SystemExit(exit_code(signum))
