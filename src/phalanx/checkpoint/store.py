"""Checkpoints that are never half-written: DCP directories committed atomically.

Layout: `OUT/checkpoints/step-00000120/` holds DCP's files (`.metadata`, `*.distcp`),
`train_state.json` (everything that is not a tensor) and, written last, `manifest.json`
(step, world size, config hash, versions, every file's size and SHA-256).

Commit protocol (`save_checkpoint`):
1. rank 0 creates `.tmp-step-…/`; every rank writes its part with DCP (a collective);
2. rank 0 writes `train_state.json`, then `manifest.json`, fsyncs files and directory,
   and renames the directory into place — only then does it exist under its real name;
3. the `latest` marker moves (write + rename), then old checkpoints beyond `keep` go.
A failure anywhere leaves the previous checkpoints untouched and removes the temporary
directory; every rank raises the same error.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from phalanx.checkpoint.safety import SafeFileSystemReader, check_metadata
from phalanx.errors import UserError
from phalanx.faults import fault_point

MANIFEST, STATE, LATEST = "manifest.json", "train_state.json", "latest"


class CheckpointError(UserError):
    """A checkpoint could not be written or read; the message names it and why."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _agree(error: str | None) -> None:
    """Rank 0's error (or None) reaches every rank, so all of them raise or none does."""
    box = [error]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise CheckpointError(box[0])


def _tensor_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None):
    if optimizer is None:
        msd, osd = get_state_dict(model, []), {"state": {}, "param_groups": []}
    else:
        msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd["state"]}, osd


def committed(root: Path) -> list[Path]:
    """Committed checkpoint directories under `root`, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / MANIFEST).is_file())


def _commit(tmp: Path, final: Path, manifest: dict, keep: int) -> None:
    files = sorted(p for p in tmp.iterdir() if p.is_file())
    manifest["files"] = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1))
    for p in files:  # DCP's sync_files fsyncs its own; make sure of the rest
        with open(p, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    marker = final.parent / f".{LATEST}.tmp"
    _write_synced(marker, final.name)
    os.replace(marker, final.parent / LATEST)
    for old in committed(final.parent)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def save_checkpoint(root: Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None, meta: dict[str, Any], *,
                    keep: int = 3, config_hash: str = "") -> Path:
    """Write and commit checkpoint `step` under `root` (a collective: call on every rank)."""
    if keep < 1:
        raise UserError(f"`--keep-checkpoints` must be at least 1, got {keep}.")
    root, rank = Path(root), dist.get_rank() if dist.is_initialized() else 0
    tmp, final = root / f".tmp-{step_name(step)}", root / step_name(step)
    error = None
    if rank == 0:
        try:
            for stale in root.glob(".tmp-step-*"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as exc:
            error = f"cannot create checkpoint directory `{tmp}`: {exc.strerror}"
    _agree(error)
    state, osd = _tensor_state(model, optimizer)
    fault_point("checkpoint", step)
    try:
        dcp.save(state, storage_writer=FileSystemWriter(tmp, sync_files=True))
    except Exception as exc:  # DCP gathers every rank's failure into one exception
        error = f"writing checkpoint {step_name(step)} failed: {_root_cause(exc)}"
    if rank == 0 and error is None:
        try:
            groups = [{k: v for k, v in g.items()} for g in osd["param_groups"]]
            sidecar = {"step": step, "meta": meta, "optimizer_param_groups": groups}
            _write_synced(tmp / STATE, json.dumps(sidecar, indent=1, default=_jsonable))
            world = dist.get_world_size() if dist.is_initialized() else 1
            manifest = {"format": "phalanx-dcp-1", "step": step, "world_size": world,
                        "config_hash": config_hash, "torch": torch.__version__,
                        "phalanx": _version(), "created": time.time()}
            _commit(tmp, final, manifest, keep)
        except OSError as exc:
            error = f"committing checkpoint {step_name(step)} failed: {exc.strerror or exc}"
    if rank == 0 and error is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    _agree(error and f"{error}. The previous checkpoints in `{root}` are intact; free space "
                     f"or choose a writable `--out`.")
    return final


def _root_cause(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("No space left on device", "Read-only file system", "Permission denied"):
        if marker in text:
            return marker
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def _version() -> str:
    from phalanx import __version__

    return __version__


def verify(path: Path) -> str | None:
    """Why the checkpoint at `path` must not be used, or None if it verifies."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return "no manifest (never committed, or written by something else)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError):
        return "manifest is not valid JSON"
    for name, info in files.items():
        file = path / name
        if not file.is_file():
            return f"file `{name}` is missing"
        if file.stat().st_size != info["size"]:
            return f"file `{name}` has {file.stat().st_size} bytes, manifest says {info['size']}"
        if _sha256(file) != info["sha256"]:
            return f"file `{name}` does not match its checksum (corrupted)"
    check_metadata(path)  # raises UnsafeCheckpoint
    return None


def read_sidecar(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / STATE).read_text())


def load_checkpoint(path: Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Load a verified checkpoint into `model`/`optimizer` (any world size); return its meta."""
    path = Path(path)
    metadata = check_metadata(path)
    state, osd = _tensor_state(model, optimizer)
    _check_shapes(path, state, metadata)
    dcp.load(state, storage_reader=SafeFileSystemReader(path))
    sidecar = read_sidecar(path)
    if optimizer is not None:
        osd["state"] = state["optim"]
        saved = sidecar.get("optimizer_param_groups", [])
        if len(saved) == len(osd["param_groups"]):
            for live, old in zip(osd["param_groups"], saved):
                live.update({k: tuple(v) if isinstance(v, list) and k != "params" else v
                             for k, v in old.items()})
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=osd)
    else:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={})
    return sidecar.get("meta", {})


def _check_shapes(path: Path, state: dict, metadata) -> None:
    saved = metadata.state_dict_metadata
    problems = []
    for key, tensor in _flatten(state):
        if key not in saved:
            problems.append(f"`{key}` is not in the checkpoint")
        elif tuple(saved[key].size) != tuple(tensor.shape):
            problems.append(f"`{key}` is {tuple(saved[key].size)} there, "
                            f"{tuple(tensor.shape)} here")
    if problems:
        raise CheckpointError(f"checkpoint `{path}` does not fit this model: "
                              f"{'; '.join(problems[:4])}"
                              + (f" (and {len(problems) - 4} more)" if len(problems) > 4 else "")
                              + ". Resume with the configuration it was written with.")


def _flatten(tree: Any, prefix: str = ""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}{k}.")
    elif isinstance(tree, torch.Tensor):
        yield prefix[:-1], tree
