"""Data: corpus → byte tokens (cached) → fixed windows → sharded, resumable batches."""

from phalanx.data.corpus import TokenSplits, prepare
from phalanx.data.dataset import TokenWindows
from phalanx.data.sampler import ShardedBatchSampler
from phalanx.data.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "ShardedBatchSampler", "TokenSplits", "TokenWindows", "prepare"]
