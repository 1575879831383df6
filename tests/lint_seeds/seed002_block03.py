model = MiniGPT(
    vocab_size=VOCAB_SIZE,
    n_embed=384, n_head=6, n_layer=6,
    block_size=BLOCK_SIZE, dropout=0.1,
    grad_checkpointing=True   # keep if you already use it
).to(device)

# Wrap with DDP (for CUDA: device_ids=[device])
model = DDP(model, device_ids=[device] if device.type == "cuda" else None)

opt = torch.optim.AdamW(model.parameters(), lr=LR)
scaler = torch.cuda.amp.GradScaler(enabled=USE_AMP)
