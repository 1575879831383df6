"""Writing checkpoints: the commit protocol, synchronously or in the background.

Every save is a collective (all ranks call it at the same step):
1. rank 0 creates `.tmp-step-…/` (no collective: see `_Job.begin`);
2. every rank writes its part with DCP into it — `dcp.save`, or `dcp.async_save`, which
   copies the state to memory and writes from a thread (on its own gloo group, so its
   collectives never interleave with training's);
3. when DCP has finished on every rank (rank 0's DCP call completes only after all
   ranks' writes), rank 0 writes `train_state.json` and `manifest.json`, fsyncs, renames
   the directory into place, moves `latest` and rotates — see `commit`. For a
   background save this also runs in DCP's thread, so training never waits for the
   checksums.
At most one background save is in flight: a new save first finishes the previous one.
A failure leaves the previous checkpoints untouched and removes the temporary directory;
every rank raises the same error (for a background save: at the next save or wait).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from phalanx.checkpoint.digest import entry, file_digest
from phalanx.checkpoint.staging import ReusedBufferStager
from phalanx.checkpoint.store import (
    LATEST,
    MANIFEST,
    STATE,
    CheckpointError,
    committed,
    fsync_dir,
    step_name,
    step_of,
    write_synced,
)
from phalanx.checkpoint.writer import DigestingWriter
from phalanx.cluster.faults import fault_point
from phalanx.errors import UserError
from phalanx.paths import atomic_write, ensure_dir, remove_tree
from phalanx.version import __version__

ROTATED = ".rotated-"  # a rotated-out checkpoint being deleted (see `rotate`)


def _agree(error: str | None) -> None:
    """Rank 0's error (or None) reaches every rank, so all of them raise or none does."""
    box = [error]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise CheckpointError(box[0])


def commit(tmp: Path, final: Path, manifest: dict, keep: int,
           written: dict[str, tuple[int, str]] | None = None,
           later: list[Path] | None = None) -> int:
    """Manifest → fsync → rename into place → `latest` → rotation (rank 0 only).
    `written`: name -> (size, checksum) of the files DCP wrote (hashed as they were
    written, and fsynced by the rank that wrote each); any other file is hashed here.
    `later`: see `rotate`. Returns how many bytes had to be read back and hashed here."""
    written, reread = written or {}, 0
    files = sorted(p for p in tmp.iterdir() if p.is_file())
    manifest["files"] = {}
    for p in files:
        size = p.stat().st_size
        known = written.get(p.name)
        if known is None or known[0] != size:
            known, reread = (size, file_digest(p)), reread + size
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
        manifest["files"][p.name] = entry(*known)
    write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1))
    fsync_dir(tmp)
    if os.path.lexists(final):
        remove_tree(final)  # a link there is unlinked, never followed
    os.rename(tmp, final)
    fsync_dir(final.parent)
    atomic_write(final.parent / LATEST, final.name, sync=True)  # via `.latest.tmp`
    rotate(final, keep, later)
    return reread


def rotate(final: Path, keep: int, later: list[Path] | None = None) -> None:
    """Remove the oldest committed checkpoints so that `keep` remain, `final` (the one
    just committed, which `latest` names) among them. Only checkpoints committed before
    `final` at a lower step go: never the newest, never another lineage's future.
    `later`: rename each to `.rotated-step-…` (gone from every listing at once) and
    append it there for the caller to delete off the training's critical path."""
    older = [p for p in committed(final.parent)
             if p != final and step_of(p) < step_of(final)]
    for old in older[:max(0, len(older) - (keep - 1))]:
        if later is None:
            remove_tree(old)
            continue
        trash = old.with_name(f"{ROTATED}{old.name}")
        try:
            os.rename(old, trash)
        except OSError:
            remove_tree(old)
        else:
            later.append(trash)


def _root_cause(exc: BaseException, where: Path) -> str:
    """The reason behind a failed write; DCP's CheckpointException wraps every rank's.
    A full disk can surface as a serialiser error ("enforce fail … unexpected pos"), so
    the free space is looked at too."""
    causes = [exc]
    if isinstance(exc, CheckpointException):
        causes = [(f[0] if isinstance(f, tuple) else f) for f in exc.failures.values()] or causes
    for marker in ("No space left on device", "Read-only file system", "Permission denied",
                   "Disk quota exceeded"):
        if any(marker in str(c) for c in causes):
            return marker
    first = causes[0]
    text = f"{type(first).__name__}: {str(first).splitlines()[0] if str(first) else ''}"
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return text
    if free < 1 << 20:  # said the same way however torch surfaced it
        return "No space left on device"
    return text


def jsonable(value: Any) -> Any:
    """What the checkpoint's JSON sidecar makes of a value json cannot write itself."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


class _Job:
    """One checkpoint on its way from a temporary directory to a committed one."""

    def __init__(self, root: Path, step: int, meta: dict, keep: int, config_hash: str) -> None:
        self.root, self.step, self.meta, self.keep = root, step, meta, keep
        self.config_hash = config_hash
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.tmp, self.final = root / f".tmp-{step_name(step)}", root / step_name(step)
        self.error: str | None = None
        self.groups: list[dict] = []
        self.finished = threading.Event()  # written and (rank 0) committed or failed
        self.staged: Future | None = None  # the copy of the state is complete
        self.writer = DigestingWriter(self.tmp, sync_files=True)
        self.trash: list[Path] | None = None  # a list: rotated checkpoints to delete later
        self.timings: dict[str, float] = {}  # seconds: stall, write, commit
        self._t0 = time.perf_counter()

    def begin(self, removing: bool = False) -> None:
        """Rank 0 makes the temporary directory (after removing what an ended process
        left: `.tmp-step-*`, and `.rotated-*` unless this process is `removing` them).
        No collective: no rank writes before DCP's plan, which rank 0 sends only after
        this; DCP's first step creates the directory on every rank, so if rank 0 cannot,
        DCP fails on every rank and every rank raises rank 0's message (`agree`)."""
        if self.rank == 0:
            stale = [*self.root.glob(".tmp-step-*"), *([] if removing else
                                                        self.root.glob(f"{ROTATED}*"))]
            try:
                for path in stale:
                    if path == self.tmp and path.is_dir() and not path.is_symlink():
                        for child in list(path.iterdir()):  # (an ended process's files)
                            remove_tree(child)  # the directory stays: another rank's DCP
                        continue  # may have just made it, and a removal under its mkdir
                        # fails that rank with "File exists" (seen once in CI, 3 ranks)
                    remove_tree(path)  # a link is unlinked: never followed
                ensure_dir(self.tmp)  # another rank's DCP may be first; a link: refused
            except OSError as exc:
                self.error = f"cannot create checkpoint directory `{self.tmp}`: {exc.strerror}"
            except UserError as exc:
                self.error = f"cannot create checkpoint directory: {exc}"

    def write_failed(self, exc: BaseException) -> None:
        if self.error is None:  # a failure at `begin` is the first cause
            self.error = (f"writing checkpoint {step_name(self.step)} failed: "
                          f"{_root_cause(exc, self.root)}")

    def complete(self, future: Future | None = None) -> None:
        """After the write (in DCP's thread for a background save): note a failure, commit
        on rank 0, and mark the job finished."""
        if future is not None:
            try:
                future.result()
            except (Exception, CheckpointException) as exc:  # every rank's failures, gathered
                self.write_failed(exc)
        t_written = time.perf_counter()
        self.timings["write"] = t_written - self._t0
        self.commit()
        self.timings["commit"] = time.perf_counter() - t_written
        self.finished.set()

    def commit(self) -> None:
        """Rank 0: write the sidecar and manifest and rename into place."""
        if self.rank != 0:
            return
        if self.error is None:
            try:
                sidecar = {"step": self.step, "meta": self.meta,
                           "optimizer_param_groups": self.groups}
                write_synced(self.tmp / STATE, json.dumps(sidecar, indent=1, default=jsonable))
                manifest = {"format": "phalanx-dcp-1", "step": self.step,
                            "world_size": self.world, "config_hash": self.config_hash,
                            "torch": torch.__version__, "phalanx": __version__,
                            "created": time.time()}
                self.timings["reread_bytes"] = commit(self.tmp, self.final, manifest, self.keep,
                                                      self.writer.digests, self.trash)
            except OSError as exc:
                self.error = (f"committing checkpoint {step_name(self.step)} failed: "
                              f"{exc.strerror or exc}")
        if self.error is not None:
            remove_tree(self.tmp)

    def agree(self) -> None:
        _agree(self.error and f"{self.error}. The previous checkpoints in `{self.root}` are "
                              f"intact; free space or choose a writable `--out`.")



def _delete_quietly(paths: list[Path]) -> None:
    """Delete `paths` at the lowest CPU priority this thread can take (Linux: a thread's
    own nice value), so freeing their pages does not take a core from training."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux: the same work at normal priority
        pass
    for path in paths:
        remove_tree(path)


class CheckpointSaver:
    """Saves checkpoints for one `Run`; holds the one background save in flight."""

    def __init__(self) -> None:
        self._pending: _Job | None = None
        self._group: Any = None
        self._staging: ReusedBufferStager | None = None
        self._removing: threading.Thread | None = None  # rotated checkpoints being deleted
        self.last_timings: dict[str, float] = {}  # of the newest save: stall, write, commit

    def save(self, root: Path, step: int, state_fn: Callable[[], dict], groups: list[dict],
             meta: dict[str, Any], *, keep: int = 3, config_hash: str = "",
             asynchronous: bool = False, deferred: set[str] | None = None) -> Path:
        """Write and commit checkpoint `step` under `root` (a collective). `state_fn` gives
        this rank's part of the tensors (the strategy's `save_state`), `groups` the
        optimizer's hyperparameters. `deferred`: names of parameters whose staging copy
        (and the optimizer state's) may finish during the next forward/backward."""
        if keep < 1:
            raise UserError(f"`--keep-checkpoints` must be at least 1, got {keep}.")
        self.wait()
        job = _Job(Path(root), step, meta, keep, config_hash)
        self.last_timings = job.timings
        job.begin(self._removing is not None and self._removing.is_alive())
        job.timings["begin"] = time.perf_counter() - job._t0
        state = state_fn()
        job.timings["state_dict"] = time.perf_counter() - job._t0 - job.timings["begin"]
        job.groups = groups
        fault_point("checkpoint", step)
        try:
            if asynchronous:
                return self._save_async(job, state, deferred)
            dcp.save(state, storage_writer=job.writer)
        except (Exception, CheckpointException) as exc:  # not an Exception subclass
            job.write_failed(exc)
        job.trash = []
        job.complete()
        self._remove(job.trash)
        job.timings["stall"] = time.perf_counter() - job._t0
        job.agree()
        return job.final

    def _save_async(self, job: _Job, state: dict, deferred: set[str] | None) -> Path:
        release = threading.Event()  # the background threads start once this returns
        try:
            # a Future, or (newer torch) an AsyncSaveResponse holding two: read by name
            response: Any = dcp.async_save(state, storage_writer=job.writer,
                                      process_group=self._background_group(),
                                      **self._stager(deferred, release))
            job.staged = getattr(response, "staging_completion", None)
            self._pending = job
            # the commit (checksums, fsync, rename) runs in DCP's thread too
            getattr(response, "upload_completion", response).add_done_callback(job.complete)
            job.timings["stall"] = time.perf_counter() - job._t0
            return job.final
        finally:
            release.set()

    def poll(self) -> bool:
        """True when no background save is in flight on this rank (no collective)."""
        return self._pending is None or self._pending.finished.is_set()

    def wait(self) -> None:
        """Finish the background save (a collective): it is committed, or all ranks raise
        its error."""
        job, self._pending = self._pending, None
        if job is not None:
            job.finished.wait()
            job.agree()

    def finish_local(self) -> None:
        """At shutdown: let this rank's background write end (committed if it can be),
        without any collective (other ranks may be gone)."""
        job, self._pending = self._pending, None
        if job is not None:
            job.finished.wait()
        self._removed()

    def _remove(self, paths: list[Path]) -> None:
        """Delete rotated checkpoints in a thread: a synchronous save returns without
        waiting for the file system to free them. (A save's `begin` also removes any
        `.rotated-*` left by a process that ended first.)"""
        if paths:
            self._removed()
            self._removing = threading.Thread(target=_delete_quietly, args=(paths,),
                                              name="phalanx-rotate", daemon=False)
            self._removing.start()

    def _removed(self) -> None:
        if self._removing is not None:
            self._removing.join()
            self._removing = None

    def staged(self) -> None:
        """Wait until the background save's copy of the state is complete (no collective)."""
        job = self._pending
        if job is not None and job.staged is not None:
            t0 = time.perf_counter()
            job.staged.result()
            job.staged = None
            job.timings["staged_wait"] = time.perf_counter() - t0

    def _stager(self, deferred: set[str] | None, release: threading.Event) -> dict:
        """`async_stager=` for torch versions that take one (2.7+), with reused buffers;
        the `deferred` parameters and the optimizer state are copied later, once
        `release` is set."""
        if "async_stager" not in inspect.signature(dcp.async_save).parameters:
            return {}
        if self._staging is None:
            self._staging = ReusedBufferStager()
        self._staging.release = release
        params = deferred or set()
        self._staging.deferred = lambda path: deferred is not None and (
            path[0] == "optim" or (path[0] == "model" and ".".join(path[1:]) in params))
        return {"async_stager": self._staging}

    def _background_group(self):
        if self._group is None and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        return self._group
