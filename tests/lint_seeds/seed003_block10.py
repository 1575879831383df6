import torch.distributed as dist

def distributed_metrics(tensor, world_size):
    """Aggregate metrics across processes."""

    # All-reduce: sum across all processes
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    tensor = tensor / world_size  # Average

    return tensor


def gather_results(tensor, world_size, rank):
    """Gather results from all processes to rank 0."""

    gathered = [torch.zeros_like(tensor) for _ in range(world_size)]
    dist.gather(tensor, gathered if rank == 0 else None, dst=0)

    if rank == 0:
        return torch.cat(gathered)
    return None


def broadcast_config(config, rank):
    """Broadcast config from rank 0 to all."""

    if rank == 0:
        config_tensor = torch.tensor([config["lr"], config["batch_size"]])
    else:
        config_tensor = torch.zeros(2)

    dist.broadcast(config_tensor, src=0)

    return {
        "lr": config_tensor[0].item(),
        "batch_size": int(config_tensor[1].item()),
    }
