"""Tokenizers: text ↔ token ids, and how many bytes of text each token id stands for.

`--tokenizer` takes one of three spellings (`parse_spec` checks it):

- `bytes`: token = byte value, vocabulary 256. Nothing to train or load.
- `bpe[:VOCAB]`: a byte-level BPE (GPT-2's scheme) trained with Hugging Face
  `tokenizers` on the training split, VOCAB ids (default 4096, 257..65536); see
  `train_bpe`. Training is deterministic: the same text gives the same tokenizer.
- `PATH` (a `tokenizer.json`): a tokenizer saved by Hugging Face `tokenizers` or
  `transformers`, loaded with `tokenizers.Tokenizer.from_file`.

Every tokenizer has `vocab_size`, `encode(text)`, `decode(ids)`, `encode_bytes(raw)` and
`token_bytes()`: the UTF-8 bytes of text each id stands for, which turns a summed token
loss into nats per byte. It is exact for `bytes` and for byte-level BPE without a
normalizer or an added prefix space (every encoded id's bytes sum to the text's bytes);
for any other tokenizer it is None: the bytes a token stands for cannot be known.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from phalanx.config.data_spec import parse_spec
from phalanx.errors import UserError
from phalanx.paths import parse_json

__all__ = ["ByteTokenizer", "HFTokenizer", "Tokenizer", "encode_raw", "load_tokenizer_file",
           "parse_spec", "token_dtype", "train_bpe"]

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizerObject


class Tokenizer(Protocol):
    """What the trainer needs of a tokenizer: `vocab_size` (ids are below it), a `label`
    for the banner and report, text ↔ ids, and `token_bytes` (see the module docstring)."""

    vocab_size: int
    label: str

    def encode(self, text: str) -> list[int]: ...

    def encode_bytes(self, raw: bytes) -> np.ndarray: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def token_bytes(self) -> np.ndarray | None: ...


def token_dtype(vocab_size: int) -> str:
    """The smallest unsigned dtype that holds every id."""
    return "uint8" if vocab_size <= 256 else "uint16" if vocab_size <= 65536 else "uint32"


class ByteTokenizer:
    """Token = byte value, vocabulary 256."""

    vocab_size = 256
    label = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, raw: bytes) -> np.ndarray:
        return np.frombuffer(raw, dtype=np.uint8)

    def decode(self, tokens: Iterable[int]) -> str:
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")

    def decode_bytes(self, tokens: Iterable[int]) -> bytes:
        return bytes(int(t) for t in tokens)

    def token_bytes(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)


@lru_cache(maxsize=1)
def _byte_to_char() -> dict[int, str]:
    """GPT-2's byte ↔ printable character map, the alphabet of byte-level BPE."""
    # printable bytes map to themselves, the others to chr(256 + n) in byte order
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer` behind the common interface."""

    def __init__(self, tok: HFTokenizerObject, label: str) -> None:
        self.tok, self.label = tok, label
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values(), default=-1) + 1
        self._byte_ids = self._byte_level_ids()

    def _config(self) -> dict:
        return json.loads(self.tok.to_str())

    def _byte_level_ids(self) -> list[int] | None:
        """Each byte's own token id when this is an exact byte-level tokenizer, else None."""
        cfg = self._config()
        pre = cfg.get("pre_tokenizer") or {}
        parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
        byte_level = [p for p in parts if p.get("type") == "ByteLevel"]
        if (cfg.get("normalizer") or not byte_level or (cfg.get("decoder") or {}).get("type")
                != "ByteLevel" or any(p.get("add_prefix_space") for p in byte_level)):
            return None
        found = [self.tok.token_to_id(c) for c in _byte_to_char().values()]
        ids = [i for i in found if i is not None]
        return ids if len(ids) == 256 else None  # a byte it cannot spell: not exact

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        fast = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)  # (no offsets;
        return [e.ids for e in fast(list(texts), add_special_tokens=False)]  # tokenizers 0.20)

    def encode_bytes(self, raw: bytes) -> np.ndarray:
        return np.asarray(encode_raw(self, [raw])[0], dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def decode_bytes(self, ids: Iterable[int]) -> bytes | None:
        """The exact bytes of text `ids` stand for (even a character cut in two), for an
        exact byte-level tokenizer; None for any other."""
        if self._byte_ids is None:
            return None
        to_byte = {c: b for b, c in _byte_to_char().items()}
        added = {i: t.content for i, t in self.tok.get_added_tokens_decoder().items()}
        out = bytearray()
        for i in ids:
            token = added.get(int(i))
            if token is not None:
                out += token.encode("utf-8")
                continue
            for c in self.tok.id_to_token(int(i)) or "":
                out += bytes([to_byte[c]]) if c in to_byte else c.encode("utf-8")
        return bytes(out)

    def byte_id(self, b: int) -> int | None:
        """The id of the token that is byte `b` alone (byte-level tokenizers), else None."""
        return None if self._byte_ids is None else self._byte_ids[b]

    def token_bytes(self) -> np.ndarray | None:
        """Bytes of text per id (exact byte-level tokenizers; None otherwise). An added
        token (e.g. `<|endoftext|>`) is cut from the text as is: its content's bytes."""
        if self._byte_ids is None:
            return None
        to_byte = {c: b for b, c in _byte_to_char().items()}
        out = np.zeros(self.vocab_size, dtype=np.int64)
        for token, i in self.tok.get_vocab(with_added_tokens=False).items():
            out[i] = sum(1 if c in to_byte else len(c.encode()) for c in token)
        for i, added in self.tok.get_added_tokens_decoder().items():
            out[i] = len(added.content.encode("utf-8"))
        return out


def _cut(raw: bytes) -> tuple[int, int]:
    """Bytes at the start (continuations) and end (an unfinished character) of `raw`
    that are pieces of UTF-8 characters cut by a split boundary."""
    head = 0
    while head < min(3, len(raw)) and raw[head] & 0xC0 == 0x80:
        head += 1
    for back in range(1, min(4, len(raw) - head) + 1):
        b = raw[-back]
        if b & 0xC0 == 0x80:
            continue
        need = 1 if b < 0x80 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4
        return head, (back if need > back else 0)
    return head, 0


def encode_raw(tok: HFTokenizer, pieces: Sequence[bytes]) -> list[list[int]]:
    """Encode UTF-8 byte strings that a split boundary may have cut inside a character:
    such edge bytes become their single-byte tokens (byte-level tokenizers; others drop
    them), the rest is encoded as text. Any other invalid UTF-8 is replaced (U+FFFD)."""
    cuts = [_cut(p) for p in pieces]
    texts = [p[h:len(p) - t].decode("utf-8", "replace") for p, (h, t) in zip(pieces, cuts)]
    out = []
    for p, (h, t), ids in zip(pieces, cuts, tok.encode_batch(texts)):
        head = [tok.byte_id(b) for b in p[:h]]
        tail = [tok.byte_id(b) for b in p[len(p) - t:]]
        out.append([i for i in head if i is not None] + ids + [i for i in tail if i is not None])
    return out


def train_bpe(texts: Iterable[str], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE trained on `texts` (streamed): GPT-2's pre-tokenizer, all 256
    bytes in its alphabet (any text encodes, nothing is unknown), no special tokens."""
    from tokenizers import Tokenizer as Tok
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tok(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return HFTokenizer(tok, f"bpe {vocab_size} (trained on the training split)")


def load_tokenizer_file(path: str | Path, label: str | None = None) -> HFTokenizer:
    """A `tokenizer.json` (`--tokenizer PATH`); missing, not JSON or not a tokenizer: one
    line (UserError)."""
    from tokenizers import Tokenizer as Tok

    p = Path(path).expanduser()
    hint = ("Give the `tokenizer.json` of a Hugging Face tokenizer (`tokenizer.save(PATH)`), "
            "`bpe[:VOCAB]` or `bytes`.")
    if not p.is_file():
        raise UserError(f"`--tokenizer` `{path}` is not a file. {hint}")
    try:
        parse_json(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"`--tokenizer` `{path}` is not a JSON file ({_first_line(exc)}). "
                        f"{hint}") from None
    try:
        tok = Tok.from_file(str(p))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception
        raise UserError(f"`--tokenizer` `{path}` is JSON but not a tokenizer "
                        f"({_first_line(exc)}). {hint}") from None
    made = HFTokenizer(tok, "")
    if made.vocab_size < 1:
        raise UserError(f"`--tokenizer` `{path}` has an empty vocabulary. {hint}")
    made.label = label or f"{path} ({made.vocab_size:,} ids)"
    return made


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
