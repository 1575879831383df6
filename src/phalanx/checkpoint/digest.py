"""Checkpoint file checksums, computed while DCP writes the bytes.

A checkpoint's manifest lists every file with its size and a checksum; a resume checks
them before DCP reads anything. The checksum is XXH3-128 (the `xxhash` library): a
128-bit non-cryptographic hash, ~10 GB/s on one core, made to catch corrupted and
truncated data (a random corruption goes unnoticed with probability 2^-128). It is not
a signature — neither was SHA-256 in an unsigned manifest next to the data: whoever can
rewrite the data can rewrite the manifest. Manifests written before (`sha256` entries)
still verify.

Each rank hashes the bytes of the files it writes as they pass to the file
(checkpoint.writer), and the digests travel to the coordinator inside DCP's own write
results — no file is read back, no extra collective, and every rank hashes its share in
parallel. The coordinator's `.metadata` is hashed as it is written too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import xxhash


class _Hash(Protocol):  # what file_digest needs of xxhash's and hashlib's hash objects
    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


ALGORITHM = "xxh3_128"  # what new manifests use; key of the digest in each file entry
_ALGORITHMS: dict[str, Callable[[], _Hash]] = {"xxh3_128": xxhash.xxh3_128,
                                               "sha256": hashlib.sha256}
READ_BLOCK = 4 << 20


def file_digest(path: Path, algorithm: str = ALGORITHM) -> str:
    """The checksum of the file at `path`, read in 4 MiB blocks."""
    h = _ALGORITHMS[algorithm]()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(READ_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def entry(size: int, digest: str, algorithm: str = ALGORITHM) -> dict:
    """A manifest's file entry."""
    return {"size": size, algorithm: digest}


def entry_digest(info: dict) -> tuple[str, str] | None:
    """(algorithm, hex digest) of a manifest file entry, None when it has no known one."""
    for algorithm in _ALGORITHMS:
        if isinstance(info.get(algorithm), str):
            return algorithm, info[algorithm]
    return None


def known_algorithms() -> str:
    return " or ".join(_ALGORITHMS)


def new_hash():
    """A running checksum of ALGORITHM (`update`, `hexdigest`)."""
    return _ALGORITHMS[ALGORITHM]()
