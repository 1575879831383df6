"""The spellings `--tokenizer` and `--bin-dtype` accept (checked with the config, before
anything is read; `phalanx.data` does the reading)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from phalanx.errors import UserError

DEFAULT_BPE_VOCAB = 4096
MIN_BPE_VOCAB, MAX_BPE_VOCAB = 257, 65536  # above every byte; ids fit in uint16
BIN_DTYPES = ("uint16", "uint32")


# `--tokenizer auto` (the default): a BPE where there is text enough to learn its merges,
# bytes on a small text (a 4,096-id BPE learned from a few KB is mostly unused ids)
AUTO = "auto"
AUTO_BPE = f"bpe:{DEFAULT_BPE_VOCAB}"
AUTO_MIN_BYTES = 1 << 20  # 1 MiB of data: ~256 bytes of text per id of a 4,096-id BPE


def auto_tokenizer(data_path: str | None) -> str:
    """What `--tokenizer auto` means for `--data data_path`: `bpe:4096` for the embedded
    corpus (12 MB) and for data of at least 1 MiB on disk (its files' sizes); `bytes` for
    less, and for pre-tokenized `train.bin`/`val.bin` (their ids are the tokens)."""
    if data_path is None:
        return AUTO_BPE
    root = Path(data_path).expanduser()
    if root.is_dir() and (root / "train.bin").exists():
        return "bytes"
    total = 0
    try:
        if root.is_file():
            total = root.stat().st_size
        else:
            for folder, dirs, names in os.walk(root):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                total += sum(os.stat(os.path.join(folder, n)).st_size for n in names
                             if not n.startswith("."))
                if total >= AUTO_MIN_BYTES:
                    break
    except OSError:  # the data's reader says what is wrong with it
        pass
    return AUTO_BPE if total >= AUTO_MIN_BYTES else "bytes"


def resolve_spec(spec: str, data_path: str | None) -> str:
    """`spec`, with `auto` replaced by its choice for `data_path`."""
    return auto_tokenizer(data_path) if spec == AUTO else spec


def parse_spec(spec: str) -> tuple[str, int | str]:
    """`bytes` → ("bytes", 256); `bpe[:N]` → ("bpe", N); `auto` → ("auto", 0) (resolve it
    first: `resolve_spec`); anything else → ("file", spec). A malformed `bpe:` spec is a
    UserError naming `--tokenizer`."""
    if spec == AUTO:
        return AUTO, 0
    if spec == "bytes":
        return "bytes", 256
    if spec == "bpe" or spec.startswith("bpe:"):
        size = spec[4:] or str(DEFAULT_BPE_VOCAB)
        if not size.isdigit() or not MIN_BPE_VOCAB <= int(size) <= MAX_BPE_VOCAB:
            raise UserError(f"`--tokenizer {spec}`: the BPE vocabulary must be a whole number "
                            f"in {MIN_BPE_VOCAB}..{MAX_BPE_VOCAB} (256 bytes + merges), e.g. "
                            f"`bpe:{DEFAULT_BPE_VOCAB}`.")
        return "bpe", int(size)
    return "file", spec


UNKNOWN_VOCAB_FALLBACK = 256  # what a plan counts when a tokenizer file can't be read yet


def vocab_size_of(spec: str, data_path: str | None = None) -> int | None:
    """The vocabulary `--tokenizer spec` gives the model, without torch or `tokenizers`:
    `bytes` 256; `bpe:N` N (the most a trained BPE has; a corpus too small for N merges
    gives fewer); a `tokenizer.json` its largest id + 1 (the model's vocabulary and its
    added tokens, as `phalanx.data.tokenizer` counts them); None when the file is missing
    or not a tokenizer's JSON (it is refused when training reads it; callers that must
    count something use UNKNOWN_VOCAB_FALLBACK and say so)."""
    if spec == AUTO and data_path is not None and \
            (Path(data_path).expanduser() / "train.bin").exists():
        return None  # token ids: the largest + 1, known when they are read
    kind, value = parse_spec(resolve_spec(spec, data_path))
    if kind != "file":
        return int(value)
    import os

    path = os.path.expanduser(str(value))
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _file_vocab(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _file_vocab(path: str, mtime_ns: int, size: int) -> int | None:
    """`vocab_size_of` for a file, read once per version of it (the planner asks for
    every micro-batch size it tries)."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    model = data.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    ids: list[int] = []
    if isinstance(vocab, dict):  # BPE, WordPiece, WordLevel: token → id
        ids += [i for i in vocab.values() if isinstance(i, int)]
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids by position
        ids.append(len(vocab) - 1)
    ids += [t["id"] for t in data.get("added_tokens") or []
            if isinstance(t, dict) and isinstance(t.get("id"), int)]
    return max(ids) + 1 if ids else None
