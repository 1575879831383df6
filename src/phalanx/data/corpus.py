"""`--data` → cached train/validation token files that every rank memory-maps.

A text source (the embedded default, the standard library's own source; text files,
JSON Lines, Parquet/Arrow, a saved Hugging Face dataset: `phalanx.data.sources`) is
tokenized once into the cache (`phalanx.data.cache`: keyed, atomic, one builder);
pre-tokenized `train.bin`/`val.bin` are used in place (`phalanx.data.bins`). The split
interleaves fixed-size chunks of the raw text (every k-th chunk goes to validation), so
validation text comes from all over the corpus and is the same bytes whatever the
tokenizer (`phalanx.data.writer`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from phalanx.config.data_spec import resolve_spec
from phalanx.data.bins import check_bins
from phalanx.data.cache import (
    SUFFIX,
    building,
    cache_key,
    default_cache_dir,
    entry_key,
    file_digest,
    joined_digest,
    read_meta,
    seal,
)
from phalanx.data.sources import (
    TABLES,
    Source,
    documents,
    find_source,
    refuse_outputs_inside,
    stdlib_files,
)
from phalanx.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    Tokenizer,
    load_tokenizer_file,
    parse_spec,
    token_dtype,
    train_bpe,
)
from phalanx.data.writer import (
    join_documents,
    ranges,
    split_chunks,
    train_texts,
    write_bytes,
    write_tokens,
)
from phalanx.errors import UserError
from phalanx.paths import atomic_write

if TYPE_CHECKING:
    from phalanx.config.sections import DataConfig

__all__ = ["TokenSplits", "prepare", "prepare_data", "check_data",
           "stdlib_files", "split_chunks", "default_cache_dir"]


@dataclass(frozen=True)
class TokenSplits:
    """The train/validation token files, their sizes in tokens, and their tokenizer.

    `tokenizer_kind`: `bytes`, `bpe` (trained here), `file` (the user's), or `ids`
    (pre-tokenized bins with no tokenizer to decode them); `tokenizer_path`: its
    `tokenizer.json` (bpe, file); `val_bytes`: the validation split's text in bytes
    (None for bins); `key`, `digest`: the corpus's identity (`corpus_record`)."""

    train: Path
    val: Path
    n_train: int
    n_val: int
    description: str
    vocab_size: int = 256  # the model's vocabulary: the tokenizer's
    dtype: str = "uint8"  # of the token files
    tokenizer_kind: str = "bytes"
    tokenizer_path: Path | None = None
    tokenizer_label: str = "bytes"
    val_bytes: int | None = None
    key: str | None = None  # where the ids came from: the cache entry's (or the bins') key
    digest: str | None = None  # of the ids, train then val

    def load(self, split: str) -> np.ndarray:
        path = self.train if split == "train" else self.val
        return np.memmap(path, dtype=np.dtype(self.dtype), mode="r")

    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer that made the ids (None: bins without a tokenizer file)."""
        if self.tokenizer_kind == "bytes":
            return ByteTokenizer()
        if self.tokenizer_path is None:
            return None
        return _load(str(self.tokenizer_path), self.tokenizer_label)

    def token_bytes(self) -> np.ndarray | None:
        """Bytes of text per token id (length `vocab_size`): nats/byte = Σ token losses /
        Σ token_bytes[targets]. None where it cannot be known (see `Tokenizer`)."""
        tok = self.tokenizer()
        found = tok.token_bytes() if tok is not None else None
        if found is None or len(found) >= self.vocab_size:
            return found
        return np.concatenate([found, np.zeros(self.vocab_size - len(found), np.int64)])

    def export_tokenizer(self, out_dir: str | os.PathLike) -> Path | None:
        """Copy `tokenizer.json` into `out_dir` (beside `model.safetensors`; replaced
        atomically, a link there is replaced, not followed): its path, or None when the
        run has no tokenizer file (`bytes`, or bare token ids)."""
        target = Path(out_dir) / "tokenizer.json"
        if self.tokenizer_path is None:  # (one left by an earlier run there is not this one's)
            if os.path.lexists(target) and not target.is_dir():
                target.unlink()
            return None
        return atomic_write(target, self.tokenizer_path.read_bytes())

    def tokenizer_record(self) -> dict:
        """What a checkpoint records of the tokenizer, so that a resume with another one
        (another `--tokenizer`, or a BPE retrained on changed data: the same size, other
        merges) is refused: its kind, label, vocabulary and the file's digest."""
        digest = None if self.tokenizer_path is None else file_digest(self.tokenizer_path)
        return {"kind": self.tokenizer_kind, "label": self.tokenizer_label,
                "vocab_size": self.vocab_size, "digest": digest}


    def corpus_record(self) -> dict:
        """What a checkpoint records of the corpus its data cursor counts in, so that a
        resume on other data (a file added to `--data`, another split) is refused: the
        ids' digest and counts, and the cache key they came from."""
        return {"key": self.key, "n_train": self.n_train, "n_val": self.n_val,
                "digest": self.digest}


@lru_cache(maxsize=4)
def _load(path: str, label: str) -> HFTokenizer:
    return load_tokenizer_file(path, label)


def check_data(data: DataConfig, out: str | None = None) -> None:
    """What can be refused before anything is written: `--data` unreadable or holding the
    run directory `out` or the cache, a bad `--tokenizer` spec or file."""
    refuse_outputs_inside(find_source(data.path),
                          {"--out": out, "--cache-dir": str(_cache_root(data.cache_dir))})
    kind, arg = parse_spec(resolve_spec(data.tokenizer, data.path))
    if kind == "file":
        load_tokenizer_file(str(arg))


def prepare_data(data: DataConfig, log=print) -> TokenSplits:
    """`prepare` with the `[data]` section's settings."""
    return prepare(data.path, data.cache_dir, data.val_fraction, log, tokenizer=data.tokenizer,
                   text_field=data.text_field, bin_dtype=data.bin_dtype)


def prepare(data_path: str | None, cache_dir: str | None = None, val_fraction: float = 0.05,
            log=print, *, tokenizer: str = "bytes", text_field: str = "text",
            bin_dtype: str = "uint16") -> TokenSplits:
    """Tokenize the corpus into the cache (once) and return where its splits are."""
    source = find_source(data_path)
    root = _cache_root(cache_dir)
    refuse_outputs_inside(source, {"--cache-dir": str(root)})
    tokenizer = resolve_spec(tokenizer, data_path)
    kind, arg = parse_spec(tokenizer)
    user_tok = load_tokenizer_file(str(arg)) if kind == "file" else None
    if source.kind == "bins":
        return _bins(source, bin_dtype, kind, user_tok, tokenizer, log, root)
    extra = "" if kind == "bytes" else f"{kind}:{arg}" if kind == "bpe" else \
        f"file:{file_digest(Path(str(arg)).expanduser())}"
    if source.kind == "dataset" or any(f.suffix in (".jsonl", *TABLES) for f in source.files):
        extra += f"|field:{text_field}"
    folder = root / f"tokens-{cache_key(source.files, val_fraction, extra)}"
    meta = read_meta(folder, log)
    if meta is None:
        with building(root, folder) as (where, meta):
            if meta is None:
                meta = _build(source, where, entry_key(folder), val_fraction, kind, arg,
                              user_tok, text_field, log)
    return _splits(folder, meta)


def _cache_root(cache_dir: str | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else default_cache_dir()


def _splits(folder: Path, meta: dict) -> TokenSplits:
    dtype = meta.get("dtype", "uint8")
    kind = meta.get("tokenizer_kind", "bytes")
    train, val = (f"{split}.{SUFFIX[dtype]}" for split in ("train", "val"))
    return TokenSplits(
        folder / train, folder / val,
        int(meta["n_train"]), int(meta["n_val"]), str(meta["description"]),
        int(meta.get("vocab_size", 256)), dtype, kind,
        folder / "tokenizer.json" if kind in ("bpe", "file") else None,
        str(meta.get("tokenizer_label", "bytes")), meta.get("val_bytes"), entry_key(folder),
        joined_digest([meta["files"][train]["digest"], meta["files"][val]["digest"]]))


def _build(source: Source, tmp: Path, key: str, val_fraction: float, kind: str,
           arg: int | str, user_tok: HFTokenizer | None, text_field: str, log) -> dict:
    """Write the cache's files into `tmp` (the entry `key`'s); its meta.json's content."""
    skipped: list[str] = []
    total = sum(f.stat().st_size for f in source.files)
    count, size = join_documents(documents(source, text_field, skipped), tmp / "raw.txt",
                                 total)
    if skipped:
        log(f"note: skipped {len(skipped)} file(s) in `{source.label}` that are not UTF-8 "
            f"text, e.g. {skipped[0]}")
    if not count:
        _no_text(source, skipped)
    raw = np.memmap(tmp / "raw.txt", dtype=np.uint8, mode="r")
    tok: HFTokenizer | None = user_tok
    if kind == "bpe":
        log(f"note: training a {arg}-id BPE tokenizer on the training split (once: it is "
            f"cached in `{tmp.parent}`).")
        tok = train_bpe(train_texts(raw, val_fraction), int(arg))
    vocab = 256 if tok is None else tok.vocab_size
    dtype = token_dtype(vocab)
    paths = {s: tmp / f"{s}.{SUFFIX[dtype]}" for s in ("train", "val")}
    if tok is None:
        n = {s: write_bytes(raw, val_fraction, paths[s], s) for s in paths}
    else:
        if kind == "file":  # the user's file as it is
            shutil.copyfile(Path(str(arg)).expanduser(), tmp / "tokenizer.json")
        else:
            tok.tok.save(str(tmp / "tokenizer.json"))
        n = {s: write_tokens(tok, raw, val_fraction, paths[s], s, dtype) for s in paths}
    val_bytes = sum(end - start for start, end in ranges(len(raw), val_fraction, "val"))
    del raw
    (tmp / "raw.txt").unlink()
    unit = "files" if source.kind == "text" and not any(
        f.suffix in (".jsonl", *TABLES) for f in source.files) else "documents"
    meta = {"n_train": n["train"], "n_val": n["val"], "documents": count, "dtype": dtype,
            "description": f"{source.label}: {count} {unit}, {size:,} bytes",
            "vocab_size": vocab, "tokenizer_kind": kind,
            "tokenizer_label": "bytes" if tok is None else tok.label, "val_bytes": val_bytes,
            **seal(tmp, key)}
    (tmp / "meta.json").write_text(json.dumps(meta))
    return meta


def _no_text(source: Source, skipped: list[str]) -> None:
    if not skipped:
        raise UserError(f"`--data` `{source.label}` holds no usable text: its files are "
                        f"empty. Point `--data` at UTF-8 text files.")
    raise UserError(f"`--data` `{source.label}` holds no usable text: {skipped[0]}"
                    f"{f' (and {len(skipped) - 1} more)' if len(skipped) > 1 else ''}. "
                    f"Phalanx trains on UTF-8 text; convert it, e.g. `iconv -f latin1 -t "
                    f"utf-8 IN > OUT`, or point `--data` at text files.")


def _bins(source: Source, dtype: str, kind: str, user_tok: HFTokenizer | None, spec: str,
          log, cache: Path) -> TokenSplits:
    """Pre-tokenized `train.bin`/`val.bin`: checked, used in place (not copied)."""
    if kind == "bpe":
        raise UserError(f"`--data` `{source.label}` holds token ids already (train.bin/val.bin), "
                        f"so `--tokenizer {spec}` (given, or a preset's) has nothing to train "
                        f"on. Give the `tokenizer.json` the ids were made with (`--tokenizer "
                        f"PATH`), or `--tokenizer auto` to use the ids as they are.")
    vocab_from = f"the tokenizer `{spec}`"
    n_train, n_val, vocab, digest = check_bins(source.files, dtype,
                                               None if user_tok is None else user_tok.vocab_size,
                                               vocab_from, cache)
    desc = f"{source.label}: token ids ({dtype})"
    train, val = source.files
    ids = functools.partial(TokenSplits, train, val, n_train, n_val, desc, dtype=dtype,
                            key=cache_key(source.files, 0, f"bins:{dtype}"), digest=digest)
    if user_tok is not None:
        return ids(vocab, tokenizer_kind="file", tokenizer_label=user_tok.label,
                   tokenizer_path=Path(spec).expanduser().resolve())
    if kind == "bytes" and vocab <= 256:
        return ids(256)
    log(f"note: `--data` `{source.label}` holds token ids and no `--tokenizer` file was "
        f"given: the vocabulary is the largest id + 1 = {vocab:,}, and samples are shown "
        f"as ids. Pass the `tokenizer.json` the ids were made with to decode them.")
    return ids(vocab, tokenizer_kind="ids",
               tokenizer_label=f"none (token ids, vocabulary = largest id + 1 = {vocab:,})")
