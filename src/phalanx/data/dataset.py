"""Fixed-length training windows over a flat token array (memory-mapped)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset


class TokenWindows(Dataset):
    """Sample i is tokens [i·T, i·T + T + 1): input x = first T, target y = last T."""

    def __init__(self, tokens: np.ndarray, block_size: int) -> None:
        self.tokens, self.block_size = tokens, block_size
        self.n = (len(tokens) - 1) // block_size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        start = i * self.block_size
        chunk = torch.from_numpy(self.tokens[start:start + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class Recorded(Dataset):
    """`dataset`, appending every index read to `log` (to check data order and coverage)."""

    def __init__(self, dataset: Dataset, log: list[int]) -> None:
        self.dataset, self.log = dataset, log

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__

    def __getitem__(self, i: int):
        self.log.append(int(i))
        return self.dataset[i]
