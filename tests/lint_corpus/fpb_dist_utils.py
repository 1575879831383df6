"""Process-group setup in a helper module; `fpb_train.py` imports it, chooses the GPU
and destroys the group (lint corpus: facts established in a connected file)."""
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def setup() -> int:
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return int(os.environ.get("LOCAL_RANK", 0))


def build_loader(ds, batch_size: int) -> DataLoader:
    loader_kwargs = dict(batch_size=batch_size, sampler=DistributedSampler(ds),
                         num_workers=2, pin_memory=True)
    return DataLoader(ds, **loader_kwargs)
