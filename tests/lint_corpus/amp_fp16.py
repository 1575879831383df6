"""fp16 AMP with GradScaler in the right order, under torchrun (lint corpus: no error)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
model = DDP(nn.Linear(8, 8).cuda(), device_ids=[local_rank])
opt = torch.optim.AdamW(model.parameters())
scaler = torch.amp.GradScaler("cuda")
for _ in range(10):
    x = torch.randn(4, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).square().mean()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
