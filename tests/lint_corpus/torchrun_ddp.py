"""A correct torchrun DDP script (lint corpus: no error-level finding expected)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    ds = TensorDataset(torch.randn(1024, 16), torch.randn(1024, 1))
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=32, sampler=sampler)
    model = DDP(nn.Linear(16, 1).to(device), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    try:
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
                opt.zero_grad()
                loss.backward()
                opt.step()
            dist.all_reduce(loss)
            if rank == 0:
                print(epoch, loss.item() / dist.get_world_size())
                torch.save(model.module.state_dict(), "model.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
