import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler
import os

def setup_ddp(rank: int, world_size: int, backend: str = "nccl"):
    """Initialize DDP process group."""
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12355'

    dist.init_process_group(backend, rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)


def cleanup_ddp():
    """Clean up DDP resources."""
    dist.destroy_process_group()


def train_ddp(rank: int, world_size: int, config: dict):
    """Training function for each DDP process."""
    setup_ddp(rank, world_size)

    # Create model and wrap with DDP
    model = create_model(config).cuda(rank)
    model = DDP(model, device_ids=[rank])

    # Use DistributedSampler for data
    train_dataset = create_dataset(config)
    sampler = DistributedSampler(
        train_dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
    )
    train_loader = DataLoader(
        train_dataset,
        batch_size=config["batch_size"],
        sampler=sampler,
        num_workers=4,
        pin_memory=True,
    )

    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])

    for epoch in range(config["epochs"]):
        sampler.set_epoch(epoch)  # Important for shuffling

        for batch in train_loader:
            inputs = batch["input"].cuda(rank)
            targets = batch["target"].cuda(rank)

            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()

        # Only save on rank 0
        if rank == 0:
            torch.save(model.module.state_dict(), f"checkpoint_epoch_{epoch}.pt")

    cleanup_ddp()


# Launch training
import torch.multiprocessing as mp

if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(train_ddp, args=(world_size, config), nprocs=world_size)
