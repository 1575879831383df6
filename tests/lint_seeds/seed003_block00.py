import torch
from torch.cuda.amp import autocast, GradScaler

def memory_efficient_training(model, dataloader, optimizer):
    """Single GPU training with memory optimizations."""

    scaler = GradScaler()  # Mixed precision

    for batch in dataloader:
        optimizer.zero_grad(set_to_none=True)  # More memory efficient

        # Mixed precision forward pass
        with autocast():
            outputs = model(batch["input"].cuda())
            loss = criterion(outputs, batch["target"].cuda())

        # Scaled backward pass
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

        # Clear cache periodically (use sparingly)
        # torch.cuda.empty_cache()


# Enable memory-efficient attention (PyTorch 2.0+)
import torch.nn.functional as F

def efficient_attention(q, k, v):
    """Use Flash Attention when available."""
    return F.scaled_dot_product_attention(q, k, v)
