"""What a checkpoint may read (issue 11, items 7 and 8): only plain-named files inside
it, each listed in the manifest with its size and hash; anything else is refused before
it is read, and a data file that is not a tensor is skipped like any bad checkpoint."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import phalanx
from phalanx.checkpoint.resume import newest_valid
from phalanx.checkpoint.safety import UnsafeCheckpoint
from phalanx.checkpoint.digest import entry, file_digest
from phalanx.checkpoint.store import MANIFEST, CheckpointError, verify


@pytest.fixture(scope="module")
def run():
    with phalanx.init(seed=0, threads=1) as r:
        yield r


def _model(run, seed=0):
    torch.manual_seed(seed)
    return run.setup(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)),
                     lambda p: torch.optim.AdamW(p, lr=1e-2))


def _saved(run, root: Path, steps=(1,)) -> Path:
    model, opt = _model(run)
    for step in steps:
        path = run.save(root, step, model, opt)
    return path


def _rehash(path: Path) -> None:
    """Re-write the manifest to list exactly what is in the directory (as an attacker
    who can write the checkpoint would)."""
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"] = {p.name: entry(p.stat().st_size, file_digest(p))
                         for p in sorted(path.iterdir()) if p.name != MANIFEST and p.is_file()}
    (path / MANIFEST).write_text(json.dumps(manifest))


def _set_manifest_files(path: Path, files: dict) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"] = files
    (path / MANIFEST).write_text(json.dumps(manifest))


def _point_metadata(path: Path, target: str) -> None:
    meta = pickle.loads((path / ".metadata").read_bytes())
    for info in meta.storage_data.values():
        info.relative_path = target
    (path / ".metadata").write_bytes(pickle.dumps(meta))


@pytest.mark.parametrize("name", ["../elsewhere/secret.bin", "/etc/hostname", "sub/x", ".."])
def test_a_manifest_naming_a_file_outside_is_refused_before_reading(run, tmp_path, name):
    path = _saved(run, tmp_path / "ckpts")
    secret = tmp_path / "ckpts" / "elsewhere" / "secret.bin"
    secret.parent.mkdir()
    secret.write_bytes(b"x" * 12345)
    files = json.loads((path / MANIFEST).read_text())["files"]
    _set_manifest_files(path, {**files, name: {"size": 1, "sha256": "0" * 64}})
    why = verify(path)
    assert why is not None and "not a file directly inside the checkpoint" in why
    assert "12345" not in why  # nothing about the named file is revealed


def test_a_manifest_that_does_not_list_a_data_file_is_refused(run, tmp_path):
    path = _saved(run, tmp_path)
    files = json.loads((path / MANIFEST).read_text())["files"]
    data = next(n for n in files if n.endswith(".distcp"))
    _set_manifest_files(path, {n: i for n, i in files.items() if n != data})
    assert f"`{data}` is in the checkpoint but not listed" in verify(path)


def test_metadata_reading_another_checkpoints_data_is_refused(run, tmp_path):
    """A checkpoint with no data of its own whose DCP metadata reads a neighbour's files:
    refused, and `phalanx export` exits 2 instead of exporting the other weights."""
    other = _saved(run, tmp_path / "a" / "checkpoints")
    path = tmp_path / "b" / "checkpoints" / "step-00000001"
    shutil.copytree(other, path)
    for p in path.glob("*.distcp"):
        p.unlink()
    _point_metadata(path, f"../../../a/checkpoints/{other.name}/__0_0.distcp")
    _rehash(path)
    with pytest.raises(UnsafeCheckpoint, match="not a file of the checkpoint listed in its"):
        verify(path)
    out = tmp_path / "export" / "m.safetensors"
    proc = subprocess.run([sys.executable, "-m", "phalanx", "export", str(path), "--out",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists()


def test_a_linked_data_file_is_refused(run, tmp_path):
    path = _saved(run, tmp_path / "x")
    data = next(path.glob("*.distcp"))
    outside = tmp_path / "outside.distcp"
    shutil.move(data, outside)
    os.symlink(outside, data)
    assert "is missing or not a regular file" in verify(path)


def test_a_pickle_in_place_of_tensor_data_is_skipped_like_any_bad_checkpoint(run, tmp_path):
    _saved(run, tmp_path, steps=(1, 2))
    newest = tmp_path / "step-00000002"
    marker = tmp_path / "pwned"
    data = next(newest.glob("*.distcp"))
    data.write_bytes(pickle.dumps(_Payload(str(marker))))
    _rehash(newest)
    warnings: list[str] = []
    assert newest_valid(tmp_path, warnings.append).name == "step-00000001"
    assert len(warnings) == 1 and "does not hold a tensor at offset 0" in warnings[0]
    assert not marker.exists()


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # would create a file when unpickled


class _Evil:
    pass


def test_tensor_shaped_data_that_unpickles_more_is_one_line_on_load(run, tmp_path):
    """A data file in torch.save's format that holds something other than a tensor
    passes the cheap checks; loading refuses it (weights_only) with one message."""
    path = _saved(run, tmp_path)
    evil = path / "evil.distcp"
    torch.save(_Evil(), evil)
    meta = pickle.loads((path / ".metadata").read_bytes())
    for info in meta.storage_data.values():
        info.relative_path, info.offset, info.length = "evil.distcp", 0, evil.stat().st_size
    (path / ".metadata").write_bytes(pickle.dumps(meta))
    for p in path.glob("__*.distcp"):
        p.unlink()
    _rehash(path)
    assert verify(path) is None
    model, _ = _model(run, seed=1)
    with pytest.raises(CheckpointError, match="verified but cannot be read"):
        run.load(path, model)
