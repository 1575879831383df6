# train_ddp.py
import os, math
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

def setup_dist():
    # torchrun sets these:
    # RANK, WORLD_SIZE, LOCAL_RANK
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))

def cleanup_dist():
    dist.barrier()
    dist.destroy_process_group()

def is_main():
    # Global rank 0 only
    return int(os.environ.get("RANK", "0")) == 0

def main():
    setup_dist()
    device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if torch.cuda.is_available() else "cpu")

    # Dummy data
    x = torch.randn(10000, 128)
    y = torch.randint(0, 10, (10000,))
    ds = TensorDataset(x, y)

    # Important: DistributedSampler
    sampler = DistributedSampler(ds, shuffle=True, drop_last=True)
    dl = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=4, pin_memory=True)

    # Tiny model
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(device)

    # Wrap with DDP
    model = DDP(model, device_ids=[device] if device.type == "cuda" else None)

    optim = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loss_fn = torch.nn.CrossEntropyLoss()

    for epoch in range(5):
        sampler.set_epoch(epoch)  # different shuffles across epochs
        for xb, yb in dl:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            logits = model(xb)
            loss = loss_fn(logits, yb)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()

        # Only rank 0 prints
        if is_main():
            print(f"Epoch {epoch+1} done")

    # Save only on rank 0
    if is_main():
        torch.save(model.module.state_dict(), "ddp_model.pt")

    cleanup_dist()

if __name__ == "__main__":
    main()
