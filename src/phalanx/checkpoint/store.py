"""Checkpoints that are never half-written: DCP directories committed atomically.

Layout: `OUT/checkpoints/step-00000120/` holds DCP's files (`.metadata`, `*.distcp`),
`train_state.json` (everything that is not a tensor) and, written last, `manifest.json`
(step, world size, config hash, versions, every file's size and checksum — XXH3-128,
computed while each rank wrote its files; see checkpoint.digest).

Commit protocol (`CheckpointSaver` in checkpoint.saver):
1. rank 0 creates `.tmp-step-…/`; every rank writes its part with DCP (a collective);
2. rank 0 writes `train_state.json`, then `manifest.json`, fsyncs files and directory,
   and renames the directory into place — only then does it exist under its real name;
3. the `latest` marker moves (write + rename), then old checkpoints beyond `keep` go.
A failure anywhere leaves the previous checkpoints untouched and removes the temporary
directory; every rank raises the same error.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from phalanx.checkpoint.digest import entry_digest, file_digest
from phalanx.checkpoint.manifest import LATEST, MANIFEST, STATE, listed_files  # noqa: F401
from phalanx.checkpoint.rundir import fsync_dir, step_of  # noqa: F401 (re-exported)
from phalanx.checkpoint.safety import check_metadata, safe_reader
from phalanx.errors import UserError
from phalanx.paths import create_new, parse_json


class CheckpointError(UserError):
    """A checkpoint could not be written or read; the message names it and why."""


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def write_synced(path: Path, text: str) -> None:
    """A new file (inside a checkpoint being written), fsynced; anything already there —
    a link included — is an error, never written through."""
    create_new(path, text, sync=True)


def dcp_template(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
                 ) -> tuple[dict, dict]:
    """What DCP reads into, through torch's `get_state_dict` (which creates the
    optimizer's state if it has none yet, and gives DTensor shards for sharded models)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}, {"state": {}, "param_groups": []}
    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd["state"]}, osd


def dcp_apply(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict,
              osd: dict) -> None:
    """Load what DCP read (`dcp_template`'s tensors) into the model and optimizer."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if optimizer is None:
        set_model_state_dict(model, state["model"])
        return
    osd["state"] = state["optim"]
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=osd)


def committed(root: Path) -> list[Path]:
    """Committed checkpoint directories under `root`, in commit order (oldest first).

    Commit order is the time in each manifest (a run directory that predates lineages
    may hold an older run's higher steps), then the step."""
    if not root.is_dir():
        return []
    return commit_order(p for p in root.glob("step-*") if (p / MANIFEST).is_file())


def commit_order(paths) -> list[Path]:
    """Checkpoint directories oldest first by their manifests' commit times; one whose
    manifest is unreadable takes the place after the next lower step that has one."""
    by_step = sorted(paths, key=step_of)
    keys, last = {}, float("-inf")
    for path in by_step:
        created = committed_at(path)
        last = created if created is not None else last
        keys[path] = (last, step_of(path))
    return sorted(by_step, key=keys.__getitem__)


def committed_at(path: Path) -> float | None:
    """When checkpoint `path` was committed (its manifest's time), None if unreadable."""
    try:
        created = parse_json((Path(path) / MANIFEST).read_text()).get("created")
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return None
    return float(created) if isinstance(created, (int, float)) \
        and not isinstance(created, bool) else None


def read_latest(root: Path) -> Path | None:
    """The checkpoint the `latest` marker names, if it names one directly under `root`."""
    try:
        name = (Path(root) / LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not name.startswith("step-") or "/" in name or name in (".", ".."):
        return None
    return Path(root) / name


def latest_committed(out) -> Path | None:
    """The checkpoint run directory `out`'s `latest` names, if it is there."""
    latest = read_latest(Path(out) / "checkpoints")
    return latest if latest is not None and latest.is_dir() else None


def committed_note(out) -> str:
    """What a stopped run in `out` keeps, as its last line says it."""
    latest = latest_committed(out)
    return f"checkpoint {latest.name} is committed" if latest is not None else \
        "no checkpoint was committed yet"


def verify(path: Path, contents: bool = True) -> str | None:
    """Why the checkpoint at `path` must not be used, or None if it verifies.

    Before anything else is read: the manifest lists files by plain name only (no
    directory part, nothing absolute, no `..`), it lists `.metadata` and the sidecar,
    and the directory holds nothing it does not list. Then every listed file is a
    regular file (not a link) of the listed size and checksum; the DCP metadata is safe
    (no classes beyond DCP's own), every data file it names is one of the listed
    files, and every stored item starts as `torch.save` writes a tensor (zip magic).
    `contents=False` skips the checksums only (this process's launcher checked them).
    """
    path = Path(path)
    files, why = listed_files(path)
    if why is not None:
        return why
    for name, info in files.items():
        file = path / name
        if file.is_symlink() or not file.is_file():
            return f"`{name}` is missing or not a regular file"
        if file.stat().st_size != info["size"]:
            return f"file `{name}` has {file.stat().st_size} bytes, manifest says {info['size']}"
        found = entry_digest(info)
        assert found is not None  # listed_files checked every entry
        algorithm, digest = found
        if contents and file_digest(file, algorithm) != digest:
            return f"file `{name}` does not match its checksum (corrupted)"
    metadata = check_metadata(path)  # raises UnsafeCheckpoint
    return _check_items(path, metadata)


ZIP_MAGIC = b"PK\x03\x04"  # how torch.save starts every tensor DCP stores


def _check_items(path: Path, metadata) -> str | None:
    for index, info in metadata.storage_data.items():
        with open(Path(path) / info.relative_path, "rb") as fh:  # listed: checked on load
            fh.seek(info.offset)
            if fh.read(len(ZIP_MAGIC)) != ZIP_MAGIC:
                return (f"`{info.relative_path}` does not hold a tensor at offset {info.offset} "
                        f"(`{index.fqn}`): not written by torch.save, refused unread")
    return None


def read_sidecar(path: Path) -> dict[str, Any]:
    """The checkpoint's `train_state.json`; JSON that cannot be read is one line."""
    try:
        return parse_json((Path(path) / STATE).read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"checkpoint `{path}`: `{STATE}` is not readable JSON ({exc}). "
                        f"Resume or export another checkpoint.") from None


def load_checkpoint(path: Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None, template=dcp_template,
                    apply=dcp_apply) -> dict[str, Any]:
    """Load a verified checkpoint into `model`/`optimizer` (any world size, any strategy
    that wrote it); return its meta. `template`/`apply` are the strategy's (see
    `Strategy.load_template`): what this rank reads, and how it goes into the model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)
    metadata = check_metadata(path)
    state, osd = template(model, optimizer)
    _check_shapes(path, state, metadata)
    with warnings.catch_warnings():  # DCP warns when it loads outside a process group
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            dcp.load(state, storage_reader=safe_reader(path))
        except (Exception, CheckpointException) as exc:  # the latter gathers every rank's
            raise CheckpointError(
                f"checkpoint `{path}` verified but cannot be read "
                f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}); it was "
                f"not written as Phalanx writes them. Move it out of `checkpoints/`, or "
                f"give `--resume` another checkpoint.") from None
    sidecar = read_sidecar(path)
    apply(model, optimizer, state, osd)
    if optimizer is not None:  # hyperparameters, onto the optimizer the user steps with
        saved = sidecar.get("optimizer_param_groups", [])
        if len(saved) == len(optimizer.param_groups):
            for live, old in zip(optimizer.param_groups, saved):
                live.update({k: tuple(v) if isinstance(v, list) else v
                             for k, v in old.items() if k != "params" and k in live})
    return sidecar.get("meta", {})


def param_groups(optimizer: torch.optim.Optimizer | None) -> list[dict]:
    """The optimizer's hyperparameters per group (no parameters), for the sidecar."""
    if optimizer is None:
        return []
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


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
