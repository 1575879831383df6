# train_ddp.py
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def main():
    # torchrun sets these automatically
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])

    torch.cuda.set_device(local_rank)

    # Create model
    model = create_model().cuda()
    model = DDP(model, device_ids=[local_rank])

    # Training loop...

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
