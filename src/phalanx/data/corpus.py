"""Text corpora: the embedded default (the standard library's own source) or user files.

A corpus is tokenized once into two flat byte files, `train.u8` and `val.u8`, in a
cache directory keyed by the sources' paths, sizes and modification times; later runs
and every rank memory-map them. Writes are atomic (temporary file, then rename), so
concurrent ranks or an interrupted run never leave a half-written cache behind.
The split interleaves fixed-size chunks (every k-th chunk goes to validation), so
validation text comes from all over the corpus, not just its tail.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phalanx.data.tokenizer import ByteTokenizer
from phalanx.errors import UserError
from phalanx.paths import kind

_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
_MAX_CHUNK = 1 << 16


@dataclass(frozen=True)
class TokenSplits:
    """Paths of the cached train/validation token files and their sizes."""

    train: Path
    val: Path
    n_train: int
    n_val: int
    description: str

    def load(self, split: str) -> np.ndarray:
        path = self.train if split == "train" else self.val
        return np.memmap(path, dtype=np.uint8, mode="r")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "phalanx"


def stdlib_files() -> list[Path]:
    """The interpreter's standard-library `.py` sources, tests and vendored packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for folder, dirs, names in os.walk(root):  # skipped folders are not walked at all
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        found.extend(Path(folder, n) for n in names if n.endswith(".py"))
    return sorted(found)


def source_files(path: str | None) -> tuple[list[Path], str]:
    """Files to read for `--data PATH` (None: the embedded stdlib corpus) and a label."""
    if path is None:
        files = stdlib_files()
        if not files:
            raise UserError("the embedded corpus (this interpreter's standard library source) "
                            "was not found; pass a text file or directory with `--data`.")
        return files, f"Python {sysconfig.get_python_version()} standard library source"
    p = Path(path).expanduser()
    found = kind(p)
    if found == "missing":
        raise UserError(f"`--data` path `{path}` does not exist. Give a text file or a "
                        f"directory of text files, or omit `--data` for the embedded corpus.")
    if found == "a regular file":
        return [p], str(p)
    if found != "a directory":
        raise UserError(f"`--data` `{path}` is {found}, not a text file or a directory: only "
                        f"regular files are read. Give a text file or a directory of them.")
    files = [f for f in sorted(p.rglob("*")) if kind(f) == "a regular file"
             and not any(part.startswith(".") for part in f.relative_to(p).parts)]
    if not files:
        raise UserError(f"`--data` directory `{path}` contains no files. "
                        f"Put text files in it or point `--data` at a text file.")
    return files, str(p)


def _read_text(files: list[Path], data_arg: str | None) -> tuple[list[bytes], list[str]]:
    """The UTF-8 text of `files`; the others, each said with why (binary / not UTF-8)."""
    texts, skipped = [], []
    for f in files:
        raw = f.read_bytes()
        if not raw.strip():
            continue
        why = "binary (it has NUL bytes)" if b"\0" in raw[:8192] else _not_utf8(raw)
        if why:
            skipped.append(f"`{f}` is {why}")
            continue
        texts.append(raw)
    if not texts:
        if not skipped:
            raise UserError(f"`--data` `{data_arg}` holds no usable text: its files are empty. "
                            f"Point `--data` at UTF-8 text files.")
        raise UserError(f"`--data` `{data_arg}` holds no usable text: {skipped[0]}"
                        f"{f' (and {len(skipped) - 1} more)' if len(skipped) > 1 else ''}. "
                        f"Phalanx trains on UTF-8 text; convert it, e.g. `iconv -f latin1 -t "
                        f"utf-8 IN > OUT`, or point `--data` at text files.")
    return texts, skipped


def _not_utf8(raw: bytes) -> str | None:
    """None for UTF-8; else where it is not (`not UTF-8: byte 0xe9 at offset 12`)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}; Latin-1 or "
                f"another 8-bit encoding?)")
    return None


def _cache_key(files: list[Path], val_fraction: float) -> str:
    h = hashlib.sha256(f"v1|{val_fraction}".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def split_chunks(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Every k-th chunk (k = 1/val_fraction) goes to validation, the rest to training."""
    period = max(2, round(1 / val_fraction))
    chunk = max(1, min(_MAX_CHUNK, len(tokens) // (4 * period)))
    n_chunks = -(-len(tokens) // chunk)
    is_val = (np.arange(n_chunks) % period) == period - 1
    mask = np.repeat(is_val, chunk)[: len(tokens)]
    return tokens[~mask], tokens[mask]


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _cached(folder: Path, meta_path: Path, log) -> TokenSplits | None:
    """The cached splits, or None when there are none — or when the cache is damaged
    (unreadable `meta.json`, split files of the wrong size): then it is rebuilt."""
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        splits = TokenSplits(folder / "train.u8", folder / "val.u8", int(meta["n_train"]),
                             int(meta["n_val"]), str(meta["description"]))
        if (splits.train.stat().st_size, splits.val.stat().st_size) == (
                splits.n_train, splits.n_val):
            return splits
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        pass
    log(f"note: the token cache in `{folder}` is damaged; rebuilding it.")
    return None


def prepare(data_path: str | None, cache_dir: str | None, val_fraction: float,
            log=print) -> TokenSplits:
    """Tokenize the corpus into the cache (once) and return where its splits are."""
    files, label = source_files(data_path)
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    folder = root / f"tokens-{_cache_key(files, val_fraction)}"
    meta_path = folder / "meta.json"
    cached = _cached(folder, meta_path, log)
    if cached is not None:
        return cached
    texts, skipped = _read_text(files, data_path)
    if skipped:
        log(f"note: skipped {len(skipped)} file(s) in `{data_path}` that are not UTF-8 text, "
            f"e.g. {skipped[0]}")
    tokens = ByteTokenizer().encode_bytes(b"\n\n".join(texts))
    train, val = split_chunks(tokens, val_fraction)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(folder / "train.u8", train.tobytes())
        _atomic_write(folder / "val.u8", val.tobytes())
        description = f"{label}: {len(texts)} files, {len(tokens):,} bytes"
        meta = {"n_train": len(train), "n_val": len(val), "description": description,
                "files": len(texts)}
        _atomic_write(meta_path, json.dumps(meta).encode())
    except OSError as exc:
        raise UserError(f"cannot write the token cache in `{root}`: {exc.strerror}. "
                        f"Pass a writable `--cache-dir`.") from None
    return TokenSplits(folder / "train.u8", folder / "val.u8", len(train), len(val), description)
