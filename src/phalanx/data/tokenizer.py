"""Byte-level tokenizer: token = byte value, vocabulary 256. Nothing to download or train."""

from __future__ import annotations

import numpy as np


class ByteTokenizer:
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, raw: bytes) -> np.ndarray:
        return np.frombuffer(raw, dtype=np.uint8)

    def decode(self, tokens) -> str:
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")
