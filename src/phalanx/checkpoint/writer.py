"""DCP's file writer, hashing every file as it writes it (see checkpoint.digest)."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.storage import WriteResult

from phalanx.checkpoint.digest import new_hash


class _DigestingFile:
    """A binary file being written whose bytes are hashed on the way."""

    def __init__(self, raw, on_close) -> None:
        self._raw, self._on_close, self._hash, self._size = raw, on_close, new_hash(), 0

    def write(self, data) -> int:
        self._hash.update(data)
        written = self._raw.write(data)
        self._size += written
        return written

    def close(self) -> None:
        if not self._raw.closed:
            self._raw.close()
            self._on_close(self._size, self._hash.hexdigest())

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, closed, ...
        return getattr(self._raw, name)


class DigestingFileSystem(FileSystem):
    """DCP's local file system, keeping the size and checksum of every file written."""

    def __init__(self) -> None:
        super().__init__()
        self.digests: dict[str, tuple[int, str]] = {}  # file name -> (size, digest)
        self._lock = threading.Lock()  # DCP may write files from several threads

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        if "w" not in mode or "b" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        name = Path(path).name

        def done(size: int, digest: str) -> None:
            with self._lock:
                self.digests[name] = (size, digest)
        with super().create_stream(path, mode) as raw:
            stream = _DigestingFile(raw, done)
            try:
                yield stream
            finally:
                stream.close()

    def rename(self, path, new_path) -> None:  # `.metadata.tmp` -> `.metadata`
        super().rename(path, new_path)
        with self._lock:
            moved = self.digests.pop(Path(path).name, None)
            if moved is not None:
                self.digests[Path(new_path).name] = moved


@dataclass(frozen=True)
class _DigestedResult(WriteResult):
    """One of DCP's write results, also carrying the writing rank's file digests."""

    digests: dict = field(default_factory=dict)


class DigestingWriter(FileSystemWriter):
    """`FileSystemWriter` that hashes what it writes. After `dcp.save`, the coordinator's
    `digests` holds every rank's files (name -> (size, digest)), `.metadata` included."""

    def __init__(self, path, **kwargs) -> None:
        super().__init__(path, **kwargs)
        self.fs = DigestingFileSystem()
        self.digests: dict[str, tuple[int, str]] = {}

    def write_data(self, plan, planner):
        results = list(super().write_data(plan, planner).wait())  # a torch Future, done
        if results:
            first = results[0]
            results[0] = _DigestedResult(first.index, first.size_in_bytes, first.storage_data,
                                         digests=dict(self.fs.digests))
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(results)
        return future

    def finish(self, metadata, results) -> None:
        for rank_results in results:
            for result in rank_results:
                self.digests.update(getattr(result, "digests", {}))
        super().finish(metadata, results)
        self.digests.update(self.fs.digests)  # .metadata, written just now
