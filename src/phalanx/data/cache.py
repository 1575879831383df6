"""The token cache: one folder per (corpus, split, tokenizer), built once, atomically.

`tokens-KEY/` holds `train.*` and `val.*` (token ids: `.u8`, `.u16` or `.u32` by dtype),
`meta.json` and, for a BPE or a user's tokenizer, `tokenizer.json`. KEY hashes the
sources' paths, sizes and modification times, the validation fraction and the tokenizer
(`bpe:VOCAB`, or a tokenizer file's content hash), plus `--text-field` when a source has
fields. The folder is built in a private temporary folder beside it and renamed into
place, so readers see a whole cache or none; an exclusive lock on the cache root makes
one process build it while the others (ranks) wait and then read it. `meta.json` binds
the folder to its KEY and each file to its digest (`seal`): a cache whose files do not
match it — damaged, swapped with another entry's, rewritten — is said and rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from phalanx.errors import UserError
from phalanx.paths import atomic_write, current_umask, parse_json

SUFFIX = {"uint8": "u8", "uint16": "u16", "uint32": "u32"}


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "phalanx"


def cache_key(files: list[Path], val_fraction: float, extra: str = "") -> str:
    """`extra` is empty for bytes of plain text, so such caches keep their old key."""
    h = hashlib.sha256(f"v1|{val_fraction}{'|' + extra if extra else ''}".encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def bytes_digest(data: bytes) -> str:
    """`file_digest` of a file holding `data`."""
    return hashlib.sha256(data).hexdigest()[:16]


def file_version(path: Path) -> list[int]:
    """This version of a file: size, modification and change times, inode, device. A
    rewrite changes the change time (ctime) even when the size and modification time are
    put back; a file moved or copied in from elsewhere has another inode."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def seal(tmp: Path, key: str) -> dict:
    """What binds a built cache to its key and contents (kept in its `meta.json`): the
    key, and each file's version and digest."""
    return {"key": key, "files": {f.name: {"version": file_version(f), "digest": file_digest(f)}
                                  for f in sorted(tmp.iterdir()) if f.name != "meta.json"}}


def entry_key(folder: Path) -> str:
    return folder.name.removeprefix("tokens-")


def joined_digest(digests: list[str]) -> str:
    """One digest of several files' digests, in order (a corpus: its train and val ids)."""
    return hashlib.sha256("|".join(digests).encode()).hexdigest()[:16]


def read_meta(folder: Path, log) -> dict | None:
    """The cache's `meta.json` when its split files have the sizes it says and its files
    are those it was built with (`seal`); None when there is no cache, or it is damaged
    or not its own (then said: it is rebuilt)."""
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return None
    why = "damaged"
    try:
        meta = parse_json(meta_path.read_text())
        item = {"uint8": 1, "uint16": 2, "uint32": 4}[meta.get("dtype", "uint8")]
        suffix = SUFFIX[meta.get("dtype", "uint8")]
        sizes = ((folder / f"train.{suffix}").stat().st_size,
                 (folder / f"val.{suffix}").stat().st_size)
        if sizes == (int(meta["n_train"]) * item, int(meta["n_val"]) * item) \
                and isinstance(meta["description"], str):
            if meta.get("tokenizer_kind") not in ("bpe", "file") \
                    or (folder / "tokenizer.json").is_file():
                unbound = _unbound(folder, meta)
                if unbound is None:
                    return meta
                why = f"does not match what it was built with: {unbound}"
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError):
        pass
    log(f"note: the token cache in `{folder}` is {why}; rebuilding it." if why == "damaged"
        else f"note: the token cache in `{folder}` {why}; rebuilding it.")
    return None


def _unbound(folder: Path, meta: dict) -> str | None:
    """Why the cache's files are not those `seal` recorded (None: they are). A file whose
    version changed is digested (`tokenizer.json`, small, always); when its digest still
    matches (a cache copied elsewhere), the record takes the new version."""
    files = meta.get("files")
    if meta.get("key") != entry_key(folder) or not isinstance(files, dict):
        return ("it was made by an earlier Phalanx, which did not record them"
                if "key" not in meta else "its record is another entry's")
    present = sorted(f.name for f in folder.iterdir() if f.name != "meta.json")
    if present != sorted(files):
        return f"it holds {', '.join(present)}; its record lists {', '.join(sorted(files))}"
    moved = False
    for name, record in files.items():
        version = file_version(folder / name)
        if version == record["version"] and name != "tokenizer.json":
            continue
        if file_digest(folder / name) != record["digest"]:
            return f"`{name}` is not the file it was built with"
        moved = moved or version != record["version"]
        record["version"] = version
    if moved:  # (a read-only cache is digested again next time)
        with contextlib.suppress(OSError):
            atomic_write(folder / "meta.json", json.dumps(meta))
    return None


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """An exclusive lock on the cache root folder itself (no lock file is left behind)."""
    with _writing(root):
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):  # no locks there (some network file systems):
            fcntl.flock(fd, fcntl.LOCK_EX)  # builders may race; the rename keeps it whole
        yield
    finally:
        os.close(fd)  # closing drops the lock


@contextlib.contextmanager
def building(root: Path, folder: Path) -> Iterator[tuple[Path, dict | None]]:
    """Under the root's lock: (a private folder to build the cache in, None), renamed to
    `folder` when the body ends; or (folder, its meta) when another process built it
    meanwhile. On an error nothing is left: the temporary folder is removed, and so is
    `root` when this made it and it is empty."""
    made_root = not root.exists()
    try:
        with _writing(root):
            root.mkdir(parents=True, exist_ok=True)
        with _locked(root):
            meta = read_meta(folder, lambda line: None)
            if meta is not None:
                yield folder, meta
                return
            with _writing(root):
                tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
            try:
                with _sources_errors():
                    yield tmp, None
                with _writing(root):
                    _move_into_place(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        if made_root:
            with contextlib.suppress(OSError):
                root.rmdir()
        raise


def _move_into_place(tmp: Path, folder: Path) -> None:
    """Rename the built `tmp` to `folder`, replacing a damaged one; when a builder that
    held no lock got there first with a whole cache, this one is dropped."""
    if folder.exists():
        if read_meta(folder, lambda line: None) is not None:
            return
        shutil.rmtree(folder)  # damaged: replaced whole
    os.chmod(tmp, 0o777 & ~current_umask())
    try:
        os.replace(tmp, folder)
    except OSError:
        if read_meta(folder, lambda line: None) is None:
            raise


@contextlib.contextmanager
def _writing(root: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise UserError(f"cannot write the token cache in `{root}`: {exc.strerror}. "
                        f"Pass a writable `--cache-dir`.") from None


@contextlib.contextmanager
def _sources_errors() -> Iterator[None]:
    """Building: a source file that cannot be read, or a full cache disk, in one line."""
    try:
        yield
    except OSError as exc:
        where = f" `{exc.filename}`" if exc.filename else ""
        raise UserError(f"building the token cache failed: {exc.strerror or exc}{where}. "
                        f"Check that `--data` is readable and `--cache-dir` has room.") \
            from None
