"""Pre-tokenized data: nanoGPT's `train.bin` / `val.bin`, flat arrays of token ids.

They are used where they are (memory-mapped, not copied into the cache), after a scan
that catches a wrong `--bin-dtype`:

- a size that is not a whole number of ids;
- a uint32 file read as uint16: every other value is 0 (ids are little-endian and below
  65536, so their high halves are zeros);
- a uint16 file read as uint32: ids beyond the vocabulary — the `--tokenizer` file's, or
  above `MAX_GUESSED_VOCAB` when there is none (the vocabulary is then max id + 1).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path

import numpy as np

from phalanx.data.cache import cache_key, file_version, joined_digest
from phalanx.errors import UserError
from phalanx.paths import atomic_write, parse_json

MAX_GUESSED_VOCAB = 1 << 20  # no tokenizer file: a larger max id means a wrong dtype
_BLOCK = 1 << 24  # ids scanned at a time


Scan = tuple[int, int, int, int, str]  # ids, max id, odd zeros, even zeros, digest


def _scan(path: Path, dtype: str) -> Scan:
    """(ids, max id, zeros at odd positions, zeros at even positions, content digest) of
    one file, in one pass."""
    size, item = path.stat().st_size, np.dtype(dtype).itemsize
    other = "uint32" if dtype == "uint16" else "uint16"
    if size == 0:
        raise UserError(f"`{path}` is empty: it holds no token ids.")
    if size % item:
        raise UserError(f"`{path}` is {size:,} bytes, not a whole number of {dtype} ids "
                        f"({item} bytes each): was it written as {other}? Pass "
                        f"`--bin-dtype {other}` if so.")
    ids = np.memmap(path, dtype=np.dtype(dtype), mode="r")
    top, odd_zeros, even_zeros, digest = 0, 0, 0, hashlib.sha256()
    for start in range(0, len(ids), _BLOCK):  # _BLOCK is even: positions keep their parity
        block = np.asarray(ids[start:start + _BLOCK])
        digest.update(block.tobytes())
        top = max(top, int(block.max()))
        if dtype == "uint16":  # (the zeros tell only a uint32 file read as uint16)
            zeros = block == 0
            odd = int(np.count_nonzero(zeros[1::2]))
            odd_zeros, even_zeros = odd_zeros + odd, even_zeros + int(
                np.count_nonzero(zeros)) - odd
    return len(ids), top, odd_zeros, even_zeros, digest.hexdigest()[:16]


def _version(path: Path, dtype: str) -> list:
    """What a scan is of: this version of the file (`cache.file_version`), read as `dtype`."""
    return [str(path.resolve()), dtype, *file_version(path)]


def _record(path: Path, dtype: str, cache: Path) -> Path:
    """Where `_scan`'s result for this version of the file (its path, size and mtime) is
    remembered: every rank of every start of a run then reads a large train.bin once."""
    return cache / f"bins-{cache_key([path], 0, f'scan:{dtype}')}.json"


def _recalled(record: Path, version: list) -> Scan | None:
    """The scan `record` holds when it was made of this `version` of the file (a record
    of another version, or of another file, is stale: scanned again, not trusted)."""
    with contextlib.suppress(OSError, ValueError):
        found = parse_json(record.read_text())
        scan = found.get("scan") if isinstance(found, dict) else None
        if found.get("file") == version and isinstance(scan, list) and len(scan) == 5 \
                and all(type(x) is int for x in scan[:4]) and isinstance(scan[4], str):
            return scan[0], scan[1], scan[2], scan[3], scan[4]
    return None  # none yet, damaged or stale: scanned again


def _remember(scans: dict[Path, tuple[list, Scan]]) -> None:
    """The scans of files that passed the checks (a refused file leaves nothing)."""
    for record, (version, result) in scans.items():
        with contextlib.suppress(OSError):  # a read-only cache: scanned again next time
            record.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(record, json.dumps({"file": version, "scan": list(result)}))


def check_bins(files: list[Path], dtype: str, vocab: int | None,
               vocab_from: str, cache: Path | None = None) -> tuple[int, int, int, str]:
    """(train ids, val ids, vocabulary, a digest of both files' ids) of `train.bin` and
    `val.bin` read as `dtype`; `vocab`: the tokenizer's (None: max id + 1); `cache`: where
    scans are remembered. A wrong dtype: one line (UserError)."""
    counts, top, fresh, digests = [], 0, {}, []
    for path in files:
        version = _version(path, dtype)
        record = _record(path, dtype, cache) if cache is not None else None
        found = _recalled(record, version) if record is not None else None
        if found is None:
            found = _scan(path, dtype)
            if record is not None:
                fresh[record] = (version, found)
        n, high, odd_zeros, even_zeros, digest = found
        if dtype == "uint16" and n >= 64 and odd_zeros == n // 2 and even_zeros < n // 4:
            raise UserError(f"`{path}` read as uint16 has 0 at every other position: it looks "
                            f"like uint32 ids. Pass `--bin-dtype uint32`.")
        counts.append(n)
        digests.append(digest)
        top = max(top, high)
    if vocab is not None and top >= vocab:
        hint = " Was it written as uint16? Pass `--bin-dtype uint16`." \
            if dtype == "uint32" else ""
        raise UserError(f"`{files[0].parent}` holds token id {top:,}, beyond the {vocab:,} ids "
                        f"of {vocab_from}: the ids were made with another tokenizer or read "
                        f"with the wrong dtype ({dtype}).{hint} Give the `tokenizer.json` "
                        f"they were made with as `--tokenizer`.")
    if vocab is None and top >= MAX_GUESSED_VOCAB:
        raise UserError(f"`{files[0].parent}` read as {dtype} holds token id {top:,}: no "
                        f"vocabulary is that large, so the dtype is likely wrong; pass "
                        f"`--bin-dtype uint16` (nanoGPT's), or the `tokenizer.json` the ids "
                        f"were made with as `--tokenizer`.")
    _remember(fresh)
    return counts[0], counts[1], vocab if vocab is not None else top + 1, \
        joined_digest(digests)
