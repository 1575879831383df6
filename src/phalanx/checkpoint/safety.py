"""Loading a DCP checkpoint without unpickling arbitrary objects.

torch.distributed.checkpoint stores its `.metadata` with `pickle` and reads it back
with a plain `pickle.load`; non-tensor values are stored as pickled bytes and read back
with `torch.load(weights_only=False)`. Phalanx writes tensors only (everything else
goes to JSON), so on load it (1) proves the `.metadata` pickle references nothing but
DCP's own metadata classes, torch sizes/dtypes/layouts and paths, before DCP opens it,
and (2) refuses any entry stored as pickled bytes. Tensor data itself is read by DCP
with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch

from phalanx.checkpoint.manifest import listed_files
from phalanx.errors import UserError

_ALLOWED = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


class UnsafeCheckpoint(UserError):
    """The checkpoint holds something that loading would have to unpickle."""


class _Restricted(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, where: Path) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        ok = name in _ALLOWED.get(module, ()) or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        if not ok:
            raise UnsafeCheckpoint(
                f"checkpoint `{self.where}` refused: its metadata pickle references "
                f"`{module}.{name}`, which loading would import and run. Phalanx only loads "
                f"checkpoints whose metadata names DCP's own classes; delete this checkpoint "
                f"or point `--resume` at a trusted one.")
        return super().find_class(module, name)


def check_metadata(checkpoint_dir: Path) -> Any:
    """Parse `.metadata` with the restricted unpickler; refuse pickled-bytes entries.
    (DCP is imported here, not with the module: a launcher with nothing to resume never
    pays for it.)"""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    path = Path(checkpoint_dir) / ".metadata"
    try:
        metadata = _Restricted(io.BytesIO(path.read_bytes()), checkpoint_dir).load()
    except UnsafeCheckpoint:
        raise
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
        raise UnsafeCheckpoint(f"checkpoint `{checkpoint_dir}` has unreadable DCP metadata "
                               f"({type(exc).__name__}: {exc}).") from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"checkpoint `{checkpoint_dir}`: `.metadata` is not DCP metadata.")
    pickled = [k for k, v in metadata.state_dict_metadata.items()
               if not isinstance(v, TensorStorageMetadata)]
    if pickled:
        raise UnsafeCheckpoint(
            f"checkpoint `{checkpoint_dir}` refused: entries {pickled[:3]} are stored as pickled "
            f"objects, which Phalanx never writes and will not unpickle.")
    _check_data_files(Path(checkpoint_dir), metadata)
    return metadata


def _check_data_files(checkpoint_dir: Path, metadata: Any) -> None:
    """Every data file the metadata names must be a file the manifest lists (a plain
    name inside the checkpoint): DCP would otherwise read wherever it points."""
    files, why = listed_files(checkpoint_dir)
    if why is not None:
        raise UnsafeCheckpoint(f"checkpoint `{checkpoint_dir}` refused: {why}.")
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict) or not storage:
        raise UnsafeCheckpoint(f"checkpoint `{checkpoint_dir}` refused: its DCP metadata "
                               f"names no data files.")
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if name not in files or not getattr(info, "offset", -1) >= 0:
            raise UnsafeCheckpoint(
                f"checkpoint `{checkpoint_dir}` refused: its DCP metadata reads `{name}`, "
                f"which is not a file of the checkpoint listed in its manifest.")


def safe_reader(path: Path) -> Any:
    """A DCP FileSystemReader of `path` that checks the metadata before DCP unpickles it."""
    from torch.distributed.checkpoint import FileSystemReader

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            check_metadata(Path(self.path))
            return super().read_metadata(*args, **kwargs)

    return SafeFileSystemReader(path)
