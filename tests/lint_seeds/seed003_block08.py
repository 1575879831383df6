from contextlib import nullcontext

def train_ddp_with_accumulation(model, dataloader, optimizer, accumulation_steps):
    """DDP training with gradient accumulation."""

    for step, batch in enumerate(dataloader):
        # Only sync gradients on accumulation boundary
        is_accumulating = (step + 1) % accumulation_steps != 0

        # Skip gradient sync during accumulation
        context = model.no_sync() if is_accumulating else nullcontext()

        with context:
            outputs = model(batch["input"].cuda())
            loss = criterion(outputs, batch["target"].cuda())
            loss = loss / accumulation_steps
            loss.backward()

        if not is_accumulating:
            optimizer.step()
            optimizer.zero_grad()
