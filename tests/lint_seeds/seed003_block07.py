def train_with_accumulation(
    model: torch.nn.Module,
    dataloader: DataLoader,
    optimizer: torch.optim.Optimizer,
    accumulation_steps: int = 4,
):
    """
    Gradient accumulation for larger effective batch size.

    Effective batch = batch_size * accumulation_steps * world_size
    """
    model.train()
    optimizer.zero_grad()

    for step, batch in enumerate(dataloader):
        # Forward pass
        outputs = model(batch["input"].cuda())
        loss = criterion(outputs, batch["target"].cuda())

        # Scale loss by accumulation steps
        loss = loss / accumulation_steps
        loss.backward()

        # Update weights every accumulation_steps
        if (step + 1) % accumulation_steps == 0:
            # Optional: gradient clipping
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)

            optimizer.step()
            optimizer.zero_grad()

    # Handle remaining gradients
    if (step + 1) % accumulation_steps != 0:
        optimizer.step()
        optimizer.zero_grad()
