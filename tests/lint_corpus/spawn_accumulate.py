"""mp.spawn with gloo, gradient accumulation done right (lint corpus: no error)."""
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ACCUM = 4


def worker(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    ds = TensorDataset(torch.randn(512, 4), torch.randn(512, 1))
    sampler = DistributedSampler(ds, shuffle=True)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(DataLoader(ds, batch_size=8, sampler=sampler)):
            sync = (i + 1) % ACCUM == 0
            with nullcontext() if sync else model.no_sync():
                (nn.functional.mse_loss(model(x), y) / ACCUM).backward()
            if sync:
                opt.step()
                opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(2, 29512), nprocs=2)
