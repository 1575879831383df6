import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def setup_dist():
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))

def is_main():
    return int(os.environ.get("RANK", "0")) == 0

setup_dist()
device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}" if torch.cuda.is_available() else "cpu")
