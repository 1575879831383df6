"""A model driven through RPC (its inputs stay on the CPU by design) and the AMP API of
an older torch as a fallback (lint corpus)."""
import torch
import torch.distributed.rpc as rpc

try:
    from torch.amp import GradScaler
except ImportError:  # torch < 2.3
    from torch.cuda.amp import GradScaler

if hasattr(torch, "autocast"):
    autocast = torch.autocast
else:
    autocast = torch.cuda.amp.autocast


def train(remote_model_cls, loader, opt):
    model_rref = rpc.remote("ps", remote_model_cls, args=("cuda:0",))
    scaler = GradScaler()
    for inputs, labels in loader:
        labels = labels.to("cpu")
        loss = model_rref.rpc_sync().forward(inputs, labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
