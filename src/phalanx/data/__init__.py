"""Data: corpus → tokens (cached) → fixed windows → sharded, resumable batches.

Submodules are imported directly (`phalanx.data.corpus` needs no torch; the sampler,
dataset and loader do), so that checking a `--data` path stays fast.
"""

_LAZY = {
    "TokenSplits": "phalanx.data.corpus", "prepare": "phalanx.data.corpus",
    "prepare_data": "phalanx.data.corpus", "ByteTokenizer": "phalanx.data.tokenizer",
    "HFTokenizer": "phalanx.data.tokenizer", "Tokenizer": "phalanx.data.tokenizer", "TokenWindows": "phalanx.data.dataset",
    "ShardedBatchSampler": "phalanx.data.sampler", "DeviceLoader": "phalanx.data.loader",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'phalanx.data' has no attribute {name!r}")
