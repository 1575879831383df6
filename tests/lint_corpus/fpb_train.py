"""The entry script of `fpb_dist_utils.py`: the device is chosen through the device
module, every epoch's order is set on the loader's sampler, the batch is a dict moved
value by value (lint corpus)."""
import torch
import torch.distributed as dist
from fpb_dist_utils import build_loader, setup
from torch.nn.parallel import DistributedDataParallel as DDP


def run_epoch(model, loader, opt, epoch, device):
    loader.sampler.set_epoch(epoch)
    for inputs, labels in loader:
        inputs = {k: v.to(device, non_blocking=True) for k, v in inputs.items()}
        labels = labels.to(device)
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()


def main(make_model, dataset):
    local_rank = setup()
    device_module = torch.get_device_module("cuda")
    device_module.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    model = DDP(make_model().to(device), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters())
    loader = build_loader(dataset, 32)
    try:
        for epoch in range(3):
            run_epoch(model, loader, opt, epoch, device)
    finally:
        dist.destroy_process_group()
