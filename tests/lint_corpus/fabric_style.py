"""A training script in Lightning Fabric's documented style: `setup` wraps model and
optimizer, `setup_dataloaders` adds the distributed sampler (and its set_epoch),
`no_backward_sync` skips the sync on accumulation steps, `fabric.save` writes once."""

import torch
from lightning.fabric import Fabric
from torch.utils.data import DataLoader


def train(model, dataset, accumulate=4, epochs=2):
    fabric = Fabric(accelerator="cuda", devices=8, num_nodes=2, strategy="ddp",
                    precision="16-mixed")
    fabric.launch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=16, shuffle=True))
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % accumulate == 0
            with fabric.no_backward_sync(model, enabled=not last):
                loss = torch.nn.functional.cross_entropy(model(x), y) / accumulate
                fabric.backward(loss)
            if last:
                fabric.clip_gradients(model, optimizer, max_norm=1.0)
                optimizer.step()
                optimizer.zero_grad()
        total = fabric.all_reduce(loss.detach(), reduce_op="mean")
        fabric.print(f"epoch {epoch}: loss {total.item():.4f}")
        fabric.log("loss", total)
    fabric.barrier()
    fabric.save("checkpoint.ckpt", {"model": model, "optimizer": optimizer, "epoch": epochs})


if __name__ == "__main__":
    train(torch.nn.Linear(8, 2), [(torch.randn(8), 0)] * 64)
