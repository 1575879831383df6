"""Building a cache: documents → one raw text file → train/validation split → token files.

Everything streams: the documents are appended to `raw.txt` one at a time, the split
reads it memory-mapped range by range, and token ids are appended to the split files a
batch of ranges at a time, so no step holds the corpus in memory.

The split is made on the raw bytes, whatever the tokenizer: every k-th chunk
(k = 1/val_fraction) is validation text. So the validation text is the same bytes for
every tokenizer (their nats per byte compare), and with `bytes` the token files are
those bytes. A chunk boundary may cut a UTF-8 character; a tokenizer then encodes the
cut pieces as single-byte tokens (see `phalanx.data.tokenizer.encode_raw`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from phalanx.data.sources import SEPARATOR, Document
from phalanx.data.tokenizer import HFTokenizer, encode_raw

MAX_CHUNK = 1 << 16
BATCH_BYTES = 8 << 20  # raw text encoded per batch


class Progress:
    """A progress bar on stderr (a terminal), shown once the work has taken over a second."""

    def __init__(self, what: str, total: int | None = None) -> None:
        self.what, self.total, self.done = what, total, 0
        self.start = time.monotonic()
        self.bar: Any = None  # rich's Progress, once shown
        self.task: Any = None

    def advance(self, n: int) -> None:
        self.done += n
        if self.bar is None and time.monotonic() - self.start > 1.0:
            from rich.console import Console
            from rich.progress import Progress as Bar

            console = Console(stderr=True)
            if not console.is_terminal:  # a log file gets no bar (nor its blank line)
                self.start = float("inf")
                return
            self.bar = Bar(console=console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(f"phalanx: {self.what}", total=self.total)
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def split_plan(n: int, val_fraction: float) -> tuple[int, int]:
    """(period, chunk): chunk j of `chunk` tokens is validation when j % period ==
    period - 1."""
    period = max(2, round(1 / val_fraction))
    return period, max(1, min(MAX_CHUNK, n // (4 * period)))


def split_chunks(tokens: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Every k-th chunk (k = 1/val_fraction) goes to validation, the rest to training."""
    period, chunk = split_plan(len(tokens), val_fraction)
    n_chunks = -(-len(tokens) // chunk)
    is_val = (np.arange(n_chunks) % period) == period - 1
    mask = np.repeat(is_val, chunk)[: len(tokens)]
    return tokens[~mask], tokens[mask]


def ranges(n: int, val_fraction: float, split: str) -> Iterator[tuple[int, int]]:
    """The [start, end) byte ranges of `split` in a raw text of n bytes, in order: the
    same selection as `split_chunks`, each run of consecutive chunks one range."""
    period, chunk = split_plan(n, val_fraction)
    for first in range(0, n, period * chunk):
        val = first + (period - 1) * chunk
        start, end = (first, val) if split == "train" else (val, val + chunk)
        if start < n:
            yield start, min(end, n)


def join_documents(docs: Iterable[Document], raw_path: Path,
                   total: int | None) -> tuple[int, int]:
    """Append the documents to `raw_path`, a blank line between two: (documents, bytes)."""
    count, size = 0, 0
    bar = Progress("reading the corpus", total)
    try:
        with open(raw_path, "wb") as fh:
            for doc in docs:
                if count:
                    fh.write(SEPARATOR)
                    size += len(SEPARATOR)
                count += 1
                for piece in (doc,) if isinstance(doc, bytes) else doc:
                    fh.write(piece)
                    size += len(piece)
                    bar.advance(len(piece))
    finally:
        bar.close()
    return count, size


def write_bytes(raw: np.ndarray, val_fraction: float, out: Path, split: str) -> int:
    """`split`'s raw bytes as byte tokens into `out`: its length."""
    with open(out, "wb") as fh:
        for start, end in ranges(len(raw), val_fraction, split):
            fh.write(raw[start:end].tobytes())
    return out.stat().st_size


def train_texts(raw: np.ndarray, val_fraction: float) -> Iterator[str]:
    """The training split's text, range by range (cut characters at the edges dropped),
    for a tokenizer to learn from: never a byte of validation text."""
    for start, end in ranges(len(raw), val_fraction, "train"):
        piece = raw[start:end].tobytes()
        yield piece.decode("utf-8", "ignore")


def _batches(raw: np.ndarray, val_fraction: float, split: str) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    size = 0
    for start, end in ranges(len(raw), val_fraction, split):
        for cut in range(start, end, BATCH_BYTES):  # a long range in pieces
            batch.append(raw[cut:min(end, cut + BATCH_BYTES)].tobytes())
            size += batch[-1].__len__()
            if size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def write_tokens(tok: HFTokenizer, raw: np.ndarray, val_fraction: float, out: Path,
                 split: str, dtype: str) -> int:
    """`split`'s text encoded with `tok` into `out` as `dtype` ids: how many."""
    count = 0
    bar = Progress(f"tokenizing the {'training' if split == 'train' else 'validation'} split",
                   len(raw))
    try:
        with open(out, "wb") as fh:
            for batch in _batches(raw, val_fraction, split):
                ids = np.fromiter((i for one in encode_raw(tok, batch) for i in one),
                                  dtype=np.dtype(dtype))
                ids.tofile(fh)
                count += len(ids)
                bar.advance(sum(len(b) for b in batch))
    finally:
        bar.close()
    return count
