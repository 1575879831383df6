"""A training script in Accelerate's documented style: `prepare` shards the loader and
wraps the model, `accumulate` skips the gradient sync and scales the loss, `backward`
unscales under AMP, `clip_grad_norm_` runs on every process, `save` writes once."""

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader


def main(model, dataset, epochs=3):
    accelerator = Accelerator(gradient_accumulation_steps=4, mixed_precision="fp16")
    loader = DataLoader(dataset, batch_size=16, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(epochs):
        model.train()
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
        mean_loss = accelerator.reduce(loss.detach(), reduction="mean")
        accelerator.print(f"epoch {epoch}: loss {mean_loss.item():.4f}")
        if accelerator.is_main_process:
            print(f"epoch {epoch} done")
    accelerator.wait_for_everyone()
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    accelerator.end_training()


if __name__ == "__main__":
    main(torch.nn.Linear(8, 2), [(torch.randn(8), 0)] * 64)
