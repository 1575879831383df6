"""What `--data` names, and its documents' text, streamed one document at a time.

Detection (`find_source`), in this order:

- no `--data`: the embedded corpus, this interpreter's standard-library `.py` sources;
- a folder holding `train.bin` and `val.bin`: token ids already made (nanoGPT), read as
  `--bin-dtype` (see `phalanx.data.bins`);
- a folder holding `dataset_dict.json` or `state.json` (what `datasets`'
  `save_to_disk` writes): a Hugging Face dataset, its `train` split when it has several;
- any other file or folder (every file below it, hidden ones skipped): each file by its
  extension: `.jsonl` one JSON object per line, text in `--text-field`; `.parquet` and
  `.arrow` tables (Arrow IPC stream or file, through `datasets`' pyarrow), text in
  `--text-field`; any other file is UTF-8 text (binary and non-UTF-8 files are skipped
  and said).

Documents are joined with a blank line (`SEPARATOR`) in file order, then split.
"""

from __future__ import annotations

import codecs
import json
import os
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import UserError
from phalanx.paths import kind

_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
SEPARATOR = b"\n\n"
TABLES = (".parquet", ".arrow")
HF_MARKERS = ("dataset_dict.json", "state.json")
NEED_DATASETS = "pip install 'phalanx[data]'"
BIG_FILE, BLOCK = 64 << 20, 16 << 20  # a text file above BIG_FILE is read BLOCK by BLOCK
Document = bytes | Iterator[bytes]  # a document's text: whole, or a large file's blocks


@dataclass(frozen=True)
class Source:
    """`--data` resolved: its kind (`text`: files read by extension, `dataset`: a saved
    Hugging Face dataset, `bins`: token ids), the files it reads, and how it is named."""

    kind: str
    files: list[Path]
    label: str
    root: Path | None = None


def stdlib_files() -> list[Path]:
    """The interpreter's standard-library `.py` sources, tests and vendored packages excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for folder, dirs, names in os.walk(root):  # skipped folders are not walked at all
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        found.extend(Path(folder, n) for n in names if n.endswith(".py"))
    return sorted(found)


def find_source(path: str | None) -> Source:
    """What `--data PATH` is (see the module docstring); a path that cannot be read is a
    UserError, before anything is written."""
    if path is None:
        files = stdlib_files()
        if not files:
            raise UserError("the embedded corpus (this interpreter's standard library source) "
                            "was not found; pass a text file or directory with `--data`.")
        return Source("text", files, f"Python {sysconfig.get_python_version()} standard "
                                     f"library source")
    p = Path(path).expanduser()
    found = kind(p)
    if found == "missing":
        raise UserError(f"`--data` path `{path}` does not exist. Give a text file or a "
                        f"directory of text files, or omit `--data` for the embedded corpus.")
    if found == "a regular file":
        if p.name in ("train.bin", "val.bin"):
            raise UserError(f"`--data` `{path}` is one of nanoGPT's token files: give the "
                            f"folder that holds both `train.bin` and `val.bin`.")
        return Source("text", [p], str(p))
    if found != "a directory":
        raise UserError(f"`--data` `{path}` is {found}, not a text file or a directory: only "
                        f"regular files are read. Give a text file or a directory of them.")
    if all(kind(p / n) == "a regular file" for n in ("train.bin", "val.bin")):
        return Source("bins", [p / "train.bin", p / "val.bin"], str(p), p)
    if any(kind(p / n) == "a regular file" for n in HF_MARKERS):
        return Source("dataset", _files_below(p, path), f"{p} (Hugging Face dataset)", p)
    return Source("text", _files_below(p, path), str(p), p)


def refuse_outputs_inside(source: Source, outputs: dict[str, str | None]) -> None:
    """What Phalanx writes (`--out`: the run's logs, metrics and checkpoints; `--cache-dir`:
    the token cache) must not be in the folder `--data` walks: it would become training
    data that changes under the run (a resume then meets another corpus). `outputs`: flag
    → path (None: not given). A hidden folder is not walked, so it may hold them."""
    if source.root is None or source.kind == "bins":  # bins: only their two files are read
        return
    root = source.root.resolve()
    for flag, path in outputs.items():
        if path is None:
            continue
        where = Path(path).expanduser().resolve()
        if where != root and root not in where.parents:
            continue
        if any(part.startswith(".") for part in where.relative_to(root).parts):
            continue
        what = "its own logs, metrics and checkpoints" if flag == "--out" else "the token cache"
        raise UserError(f"`{flag}` `{path}` is inside `--data` `{source.label}`: the run would "
                        f"train on {what}, which change as it runs. Put `{flag}` outside "
                        f"`--data`, or point `--data` at a folder that holds only the data.")


def _files_below(p: Path, path: str) -> list[Path]:
    files = [f for f in sorted(p.rglob("*")) if kind(f) == "a regular file"
             and not any(part.startswith(".") for part in f.relative_to(p).parts)]
    if not files:
        raise UserError(f"`--data` directory `{path}` contains no files. "
                        f"Put text files in it or point `--data` at a text file.")
    return files


def documents(source: Source, text_field: str, skipped: list[str]) -> Iterator[Document]:
    """The UTF-8 text of each document of a `text` or `dataset` source, in order (a large
    file in blocks); files that are not text are appended to `skipped`, each said with
    why."""
    if source.kind == "dataset":
        assert source.root is not None
        yield from _dataset_texts(source.root, text_field)
        return
    for f in source.files:
        if f.suffix == ".jsonl":
            yield from _jsonl_texts(f, text_field)
        elif f.suffix in TABLES:
            yield from _table_texts(f, text_field)
        elif f.stat().st_size > BIG_FILE:
            blank, why = _check_large(f)
            if why:
                skipped.append(f"`{f}` is {why}")
            elif not blank:
                yield _blocks(f)
        else:
            raw = f.read_bytes()
            if not raw.strip():
                continue
            why = "binary (it has NUL bytes)" if b"\0" in raw[:8192] else _not_utf8(raw)
            if why:
                skipped.append(f"`{f}` is {why}")
                continue
            yield raw


def _blocks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        yield from iter(lambda: fh.read(BLOCK), b"")


def _check_large(path: Path) -> tuple[bool, str | None]:
    """(all blank, why it is not UTF-8 text or None) of a file too large to hold, read
    block by block."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    fed, blank = 0, True
    try:
        for block in _blocks(path):
            if fed == 0 and b"\0" in block[:8192]:
                return blank, "binary (it has NUL bytes)"
            fed += len(block)
            decoder.decode(block)
            blank = blank and not block.strip()
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:  # its object: the held-back bytes + the block
        at = fed - len(exc.object) + exc.start
        return blank, (f"not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {at}; "
                       f"Latin-1 or another 8-bit encoding?)")
    return blank, None


def _not_utf8(raw: bytes) -> str | None:
    """None for UTF-8; else where it is not (`not UTF-8: byte 0xe9 at offset 12`)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}; Latin-1 or "
                f"another 8-bit encoding?)")
    return None


def _field_text(record: object, text_field: str, where: str) -> bytes:
    if not isinstance(record, dict) or text_field not in record:
        has = (", ".join(f"`{k}`" for k in list(record)[:8]) or "none") \
            if isinstance(record, dict) else f"it is a JSON {type(record).__name__}, not an object"
        raise UserError(f"{where} has no field `{text_field}` (its fields: {has}). Name the "
                        f"text field with `--text-field`.")
    value = record[text_field]
    if not isinstance(value, str):
        raise UserError(f"{where}: field `{text_field}` is {type(value).__name__}, not text. "
                        f"Name a text field with `--text-field`.")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:  # e.g. a lone surrogate escape, "\ud800": valid JSON
        raise UserError(f"{where}: field `{text_field}` holds {exc.object[exc.start]!r} at "
                        f"character {exc.start}, a lone UTF-16 surrogate that is no text "
                        f"(the JSON escapes half of a character). Fix or drop that record."
                        ) from None


def _jsonl_texts(path: Path, text_field: str) -> Iterator[bytes]:
    with open(path, encoding="utf-8", errors="strict") as fh:
        for number, line in enumerate(_lines(fh, path), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise UserError(f"`{path}` line {number} is not JSON ({exc}). A `.jsonl` file "
                                f"holds one JSON object per line.") from None
            except RecursionError:  # valid JSON, but Python's parser recurses per level
                raise UserError(f"`{path}` line {number} is nested too deeply to read (more "
                                f"than ~{sys.getrecursionlimit()} levels of arrays or "
                                f"objects). Flatten or drop that record.") from None
            text = _field_text(record, text_field, f"`{path}` line {number}")
            if text.strip():
                yield text


def _lines(fh, path: Path) -> Iterator[str]:
    try:
        yield from fh
    except UnicodeDecodeError as exc:
        raise UserError(f"`{path}` is not UTF-8 ({exc.reason} at byte {exc.start} of a "
                        f"read block); JSON Lines are UTF-8 text.") from None


def _need_datasets(what: str, module: str = "datasets"):
    """`datasets` (or `pyarrow`, the table library it brings) or a one-line UserError."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"{what} needs the `datasets` package: {NEED_DATASETS}.") from None


def _table_texts(path: Path, text_field: str) -> Iterator[bytes]:
    """A Parquet or Arrow file's `text_field` column, batch by batch."""
    _need_datasets(f"`--data` `{path}`", "pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            pf = pq.ParquetFile(path)
            names, batches = pf.schema_arrow.names, None
            if text_field in names:
                batches = pf.iter_batches(columns=[text_field], batch_size=1024)
        else:
            reader, batches = _arrow_batches(pa, path)
            names = reader.schema.names
            batches = batches if text_field in names else None
        if batches is None:
            raise UserError(f"`{path}` has no column `{text_field}` (its columns: "
                            f"{', '.join(f'`{n}`' for n in names[:8]) or 'none'}). Name the "
                            f"text column with `--text-field`.")
        for batch in batches:
            yield from _column_texts(batch.column(0) if path.suffix == ".parquet"
                                     else batch.column(text_field), path, text_field)
    except (pa.ArrowException, OSError) as exc:
        raise UserError(f"`--data` `{path}` cannot be read as {path.suffix[1:]} ({exc}).") \
            from None


def _arrow_batches(pa, path: Path):
    """(reader, its record batches) of an Arrow IPC stream (what `datasets` writes) or an
    IPC file (Feather v2: `pyarrow.ipc.new_file`, `feather.write_feather`, pandas
    `to_feather`, polars `write_ipc`), which is read by batch index, not iterated."""
    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(path)))
        return reader, iter(reader)
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        return reader, (reader.get_batch(i) for i in range(reader.num_record_batches))


def _column_texts(column, path: Path, text_field: str) -> Iterator[bytes]:
    for value in column.to_pylist():
        if value is None:
            continue
        if not isinstance(value, str):
            raise UserError(f"`{path}`: column `{text_field}` holds {type(value).__name__}, "
                            f"not text. Name a text column with `--text-field`.")
        if value.strip():
            yield value.encode("utf-8")


def _dataset_texts(root: Path, text_field: str) -> Iterator[bytes]:
    """A dataset saved with `save_to_disk` (memory-mapped, not copied): its `train` split
    when it is a DatasetDict with one, its only split otherwise."""
    datasets = _need_datasets(f"`--data` `{root}` (a Hugging Face dataset)")
    try:
        ds = datasets.load_from_disk(str(root))
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds
        raise UserError(f"`--data` `{root}` looks like a saved Hugging Face dataset but "
                        f"`datasets.load_from_disk` refused it ({exc}).") from None
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds and len(ds) != 1:
            raise UserError(f"`--data` `{root}` has splits {', '.join(ds)} and none is `train`:"
                            f" point `--data` at one split's folder.")
        ds = ds["train"] if "train" in ds else next(iter(ds.values()))
    if text_field not in ds.column_names:
        raise UserError(f"`--data` `{root}` has no column `{text_field}` (its columns: "
                        f"{', '.join(f'`{n}`' for n in ds.column_names[:8])}). Name the text "
                        f"column with `--text-field`.")
    for table in ds.select_columns([text_field]).with_format("arrow").iter(batch_size=1024):
        yield from _column_texts(table.column(0), root, text_field)
