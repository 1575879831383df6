"""`Run`: one object per process — the job's topology, its strategy — and the public
API for training on it (setup, loader, accumulate, clip, collectives, save/load, guards).
`phalanx.init()` (`phalanx.runtime.init`) builds it; strategy-specific steps go to
`run.strategy`."""

from __future__ import annotations

import contextlib
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import Dataset

from phalanx.cluster.lifecycle import StopSignals
from phalanx.cluster.protocol import record_for_agent
from phalanx.data.loader import DeviceLoader
from phalanx.data.stream_loader import StreamLoader, loader_for
from phalanx.errors import UserError
from phalanx.hang.watchdog import start_watchdog
from phalanx.report.sink import MetricsSink, reduce_values, tensorboard_note
from phalanx.runtime.accumulate import Accumulator
from phalanx.runtime.clip_and_step import StepMethods
from phalanx.runtime.clip_and_step import derive_seed as derive_seed  # (its old home)
from phalanx.runtime.collectives import CollectiveMethods
from phalanx.runtime.forward_backward import ForwardBackwardMethods
from phalanx.runtime.memory_history import plain_failure
from phalanx.runtime.pace import Pace
from phalanx.runtime.save_resume import CheckpointMethods
from phalanx.strategies.base import Strategy
from phalanx.strategies.guards import diagnose_devices
from phalanx.strategies.precision import Precision
from phalanx.strategies.topology import Topology


@dataclass
class Run(StepMethods, CheckpointMethods, CollectiveMethods, ForwardBackwardMethods):
    """This process's place in the job, and the public API for training on it."""

    topology: Topology
    strategy: Strategy
    seed: int
    threads: int
    precision: Precision | None = None  # set by `setup` (the strategy's policy and scaler)
    _saver: Any = field(default=None, repr=False)
    _watchdog: Any = field(default=None, repr=False)
    _stop: Any = field(default=None, repr=False)
    _stops_at_save: bool = field(default=False, repr=False)  # see CheckpointMethods.save
    log_dir: Path | None = None  # where `log` writes (phalanx.init's `log_dir`; settable)
    out: Path | None = None  # the run directory (`phalanx run --out`, or init's `out`)
    _optimizers: Any = field(default_factory=weakref.WeakKeyDictionary, repr=False)  # model → opt
    _pipelines: Any = field(default_factory=weakref.WeakKeyDictionary, repr=False)  # see
    # runtime.forward_backward: a model's pipeline schedule, made at its first step
    _failed: bool = field(default=False, repr=False)  # an exception left the script
    _sink: Any = field(default=None, repr=False)
    trackers: tuple[str, ...] = ()  # experiment trackers `log` also writes to (rank 0)
    memory_history: int = 0  # CUDA allocator events recorded (runtime.memory_history)
    _tracking: Any = field(default=None, repr=False)  # report.trackers.Tracking
    _said: set = field(default_factory=set, repr=False)  # see say_once
    optimizer_steps: int = 0  # counted by `step`, restored by `resume`: seeds micro-steps
    _seed_rank: int | None = field(default=None, repr=False)  # see `at_step`
    pace: Pace | None = field(default=None, repr=False)  # stragglers (runtime.pace)

    rank = property(lambda self: self.topology.rank)
    local_rank = property(lambda self: self.topology.local_rank)
    world_size = property(lambda self: self.topology.world_size)
    local_world_size = property(lambda self: self.topology.local_world_size)
    device = property(lambda self: self.topology.device)
    backend = property(lambda self: self.topology.backend)
    launcher = property(lambda self: self.topology.launcher)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- model and data ------------------------------------------------------------
    def setup(self, model: nn.Module,
              optimizer: torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None = None,
              *, precision: str = "fp32", blocks: list[nn.Module] | None = None,
              tp_plan: dict | Callable[[nn.Module], dict] | None = None):
        """The strategy places and wraps `model` (move → prepare → wrap; sharded: each of
        `blocks`, found if not given, then the root), then the optimizer is built on the
        wrapped parameters — the order every strategy needs (FSDP: after sharding).

        `optimizer` is an optimizer built on `model.parameters()` (replicated strategies
        only) or a factory called with the wrapped model's parameters. `precision`
        (fp32/bf16/fp16) sets `run.precision` (autocast, scaler) and FSDP's policy.
        `tp_plan` (with `tp` above 1): {module name: "colwise" | "rowwise" | torch
        ParallelStyle}, or a function of the model returning one; it replaces the model's
        own plan (`strategies.tensor_parallel`). With tp 1 it is not used, so one script
        runs under every layout. Returns `model` or `(model, optimizer)`.
        """
        self.precision = self.strategy.precision(precision)
        wrapped = self.strategy.setup_module(model, self.precision, blocks, tp_plan)
        timed = self.pace is not None and self.pace.on  # (hooks: only when they are read)
        if timed:
            self.strategy.time_waits(wrapped, self.waiting)
        if self.strategy.note and self.is_main:  # on stderr: not the program's output
            print(f"phalanx: {self.strategy.note}", file=sys.stderr, flush=True)
        if optimizer is None:
            return wrapped
        if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(wrapped.parameters())
        _check_optimizer_params(wrapped, optimizer)
        optimizer = self.strategy.setup_optimizer(optimizer)
        if timed:
            self.strategy.time_optimizer_waits(optimizer, self.waiting)
        self._optimizers[wrapped] = optimizer  # fp16: clip_grad_norm_ unscales it
        return wrapped, optimizer

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights on rank 0 ({} on other ranks); call on every rank
        (sharded strategies gather)."""
        return self.strategy.full_state_dict(model)

    def export(self, model: nn.Module, out_dir: str | Path) -> Path | None:
        """Write the whole model to the directory `out_dir` the way its library loads it
        back (a transformers model: `from_pretrained(out_dir)`; see
        `checkpoint.export.export_pretrained`). A collective: call it on every rank; it
        returns once rank 0 has written it: `out_dir` on rank 0, None on the others.
        A sharded transformers model is not gathered: each rank writes its shards in
        Hugging Face's layout (`checkpoint.export_sharded`; the ranks share the disk)."""
        from phalanx.checkpoint.export import export_pretrained

        if self.strategy.sharded and callable(getattr(self.unwrap(model), "save_pretrained",
                                                      None)):
            from phalanx.checkpoint import export_sharded

            tmp = export_sharded.shared_directory(self, out_dir)
            if tmp is not None:  # (else the ranks do not share a disk: gathered, below)
                return export_sharded.export_sharded_pretrained(self, model, out_dir, tmp)
        state = self.full_state_dict(model)
        path, failure = None, None
        if self.is_main:
            try:
                path = export_pretrained(self.unwrap(model), state, out_dir)
            except Exception as exc:  # said on every rank below, not left to hang them
                failure = exc
        said = self.broadcast(None if failure is None else f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure
        if said is not None:
            raise UserError(f"rank 0 could not export the model to `{out_dir}`: {said}")
        return path

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.strategy.unwrap(model)

    def loader(self, dataset: Dataset, batch_size: int, *, shuffle: bool | None = None,
               seed: int | None = None, stream: bool = False, position: int = 0,
               even: bool = True, **dataloader_kwargs: Any) -> DeviceLoader | StreamLoader:
        """This rank's share of `dataset` (split by data-parallel rank), batches on
        `run.device` (see ShardedBatchSampler). `position`: the global samples already
        consumed, honoured in both modes (epoch mode: the epoch `position // len` from
        offset `position % len`); `run.save(..., loader=)` and `run.resume` keep it for
        you. `shuffle` defaults to True. `dataset`: map-style (`__len__`, `__getitem__`),
        or an IterableDataset that shards itself by rank (data/stream_loader.py: the
        contract; `even=False` skips ending every rank's epoch together)."""
        t = self.topology
        return loader_for(
            dataset, batch_size, device=self.device, dp_rank=t.dp_rank, dp_size=t.dp_size,
            seed=self.seed, all_have=(lambda have: self.agree(have, "min") > 0)
            if even and self.world_size > 1 else None,
            sampler_options={"shuffle": shuffle, "seed": seed, "stream": stream,
                             "position": position}, **dataloader_kwargs)

    def accumulate(self, model: nn.Module, steps: int) -> Accumulator:
        """Gradient accumulation over `steps` micro-steps, syncing only on the last; each
        `micro_step()` seeds torch's RNG from (seed, optimizer step, micro-step,
        data-parallel rank) — the step `run.step` counts and `run.resume` restores — and
        runs under `setup`'s precision (autocast); `backward` scales the loss for fp16
        (call it after `setup`)."""
        return Accumulator(self.strategy, model, steps, self.precision,
                           seed=self._seed_micro_step, waiting=self.waiting)

    # -- output -----------------------------------------------------------------
    def log(self, step: int, reduce: str | None = "mean", **metrics: float | torch.Tensor):
        """Write `metrics` at `step` to `log_dir`/metrics.jsonl and TensorBoard
        (`log_dir`/tb/, when installed), from rank 0. `reduce` ("mean", "sum", "max",
        "min") first combines each value over the ranks in one all-reduce: call it on
        every rank then. `reduce=None`: rank 0's values as they are, no collective.
        Returns the record ({"step", name: value}) on every rank: the reduced values
        (with `reduce=None`, each rank's own)."""

        if self.log_dir is None:
            raise UserError("run.log needs a directory to write to, and this run has "
                            "none: phalanx.init(..., out='runs/NAME') (or log_dir=), or "
                            "run the script with `phalanx run --out DIR`.")
        with self.waiting():
            values = reduce_values(self, metrics, reduce)
        record = {"step": int(step), **values}
        if not self.is_main:
            return record
        if self._sink is None or self._sink.out_dir != Path(self.log_dir):
            self.end_log()  # opened at the first step logged (see MetricsSink)
            self.say_once(tensorboard_note(Path(self.log_dir)))
            self._sink = MetricsSink(Path(self.log_dir), step, say=self.print,
                                     device=self.device)
        written = self._sink.write(record)
        if self.trackers:  # rank 0's experiment trackers, opened at the first record
            from phalanx.report.trackers import tracking_for

            self._tracking = tracking_for(self._tracking, self.trackers,
                                          Path(self.log_dir), self.print)
            self._tracking.log(written)
        return record

    def end_log(self) -> None:
        """Close `log`'s files (the next `log` opens them again, at its step)."""
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    # -- guards -----------------------------------------------------------------------
    def check_consistency(self, model: nn.Module) -> None:
        """Compare, bit for bit, what must agree across ranks (replicas: every parameter
        and buffer; sharded: shard layouts and unsharded buffers); raise naming the first
        that differs and the ranks that disagree. A collective: call it on every rank."""
        self.strategy.check_consistency(model)

    def diagnose_devices(self, model: nn.Module, batch: Any = None) -> list[str]:
        """Every parameter, buffer and batch tensor that is not on `run.device`, one line
        each (empty when all are in place): for "Expected all tensors to be on the same
        device" errors. Local, no collective."""

        return diagnose_devices(self.unwrap(model), self.device, batch)

    def load_pretrained(self, model: nn.Module, path: str | Path) -> None:
        """Fill the set-up `model` from a local Hugging Face `save_pretrained` directory,
        each rank reading only what it holds (checkpoint.pretrained). A collective."""
        from phalanx.checkpoint.pretrained import load_pretrained

        load_pretrained(model, path)

    def profile(self, out_dir: str | Path | None = None):
        """`with run.profile():` torch's profiler over the block on every rank; then each
        rank's Chrome trace in `out_dir` (default: the run directory's `profile/`) as
        `rank-R.json.gz` and rank 0's `summary.json` (runtime.profiling). Enter it on every
        rank: writing gathers the ranks' figures."""
        from phalanx.runtime.profiling import profiling

        return profiling(self, out_dir)

    def watch(self, timeout_s: float, report_dir: str | Path | None = None) -> None:
        """Start the hang watchdog (see phalanx.hang.watchdog): when no rank progresses
        for `timeout_s`, one report names where each rank waits, and the job exits (3)."""

        if self._watchdog is None:
            self._watchdog = start_watchdog(self.rank, self.world_size, timeout_s, report_dir)

    def beat(self, step: int | None = None, phase: str | None = None) -> None:
        """Tell the hang watchdog this rank progressed (cheap; a no-op without one)."""
        if self._watchdog is not None:
            self._watchdog.beat(step, phase)

    # -- stopping on a signal ---------------------------------------------------------
    @contextlib.contextmanager
    def catch_stop_signals(self, on_request: Callable[[int], None] | None = None):
        """Within this block the first SIGINT/SIGTERM only asks to stop (see
        `stop_requested`); another one more than 2 s later stops the process at once.
        Enter it on every rank. `on_request(signum)` is told the first request as it
        arrives (from a watcher thread), e.g. to say what happens next. Blocks may nest:
        a request carries over inwards, and so does an outer block's `on_request`."""

        outer = self._stop
        if on_request is None and outer is not None:
            on_request = outer.on_request
        self._stop = StopSignals(on_request).install()
        try:
            yield self
        finally:
            if outer is not None and self._stop.requested and not outer.requested:
                outer.requested = self._stop.requested  # a request outlives the inner block
            self._stop.restore()
            self._stop = outer

    def stop_signal_here(self) -> int:
        """The stop signal this process caught (0: none), without a collective: for a
        caller that agrees on it its own way (torchft's replica groups, phalanx.ft)."""
        return self._stop.requested if self._stop is not None else 0

    def stop_requested(self) -> int:
        """The signal number that asked any rank to stop, agreed by all ranks (0: none).
        Inside `catch_stop_signals` it is a collective (one small all-reduce): call it at
        the same point of every step on every rank, then save and leave the loop."""
        if self._stop is None:
            return 0
        return int(self.agree(self._stop.requested, "max"))

    def say_once(self, text: str | None) -> None:
        """Print `text` on rank 0 the first time this Run is given it: a note such as a
        missing TensorBoard, said once per run however many loops the run drives."""
        if text and text not in self._said:
            self._said.add(text)
            self.print(text)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on rank 0 only, as one write (a line is never split by another
        thread's output into the same stream: torchft's server logs to stderr)."""
        if self.is_main:
            out, sep, end = kwargs.get("file"), kwargs.get("sep"), kwargs.get("end")
            out = sys.stdout if out is None else out
            out.write((" " if sep is None else sep).join(map(str, args))
                      + ("\n" if end is None else end))
            out.flush()

    def close(self, failed: bool = False) -> None:
        """Finish a background checkpoint (unless failing), destroy the process group
        (idempotent; also runs at exit)."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        if not failed:
            self._stop_unanswered()
        self.end_log()
        if self._tracking is not None:
            self._tracking.close()
            self._tracking = None
        if self._saver is not None and not failed:
            self._saver.finish_local()
        self._saver = None
        if dist.is_available() and dist.is_initialized():
            if not failed:
                self._quiesce()
            self.strategy.release()
            dist.destroy_process_group()

    def _quiesce(self) -> None:
        """Let the process group go idle before it is destroyed.

        torch 2.13 + gloo: a gloo thread that drops the last reference to a finished
        collective on Python-made tensors needs the GIL, holding the group's mutex; if
        the main thread is destroying the group at that moment (holding the GIL, e.g.
        from a DDP Reducer freed at exit) both wait forever. A barrier, then a short
        GIL release, lets those threads finish first; `strategy.release()` then drops
        DDP's references so the group is destroyed here, not at interpreter exit.
        """
        try:
            dist.barrier()  # the group's own timeout: rank 0 may still be writing results
        except RuntimeError as exc:  # a rank is gone: nothing to wait for
            print(f"[rank {self.rank}] warning: at shutdown, {str(exc).splitlines()[0]}",
                  file=sys.stderr, flush=True)
        time.sleep(0.05)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        plain = plain_failure(exc, self)
        if exc is not None:  # before the group goes: peers may then die of a lost connection
            record_for_agent(plain or exc)
        self.close(failed=exc_type is not None)
        if plain is not None:
            raise plain from exc


def _check_optimizer_params(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    mine = {id(p) for p in model.parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in mine:
                raise UserError(
                    "the optimizer holds a tensor that is not a parameter of the model "
                    "run.setup() returned (a sharded strategy replaces the parameters with "
                    "their shards, so an optimizer built before setup updates nothing). Pass "
                    "a factory instead: run.setup(model, lambda params: AdamW(params)).")
