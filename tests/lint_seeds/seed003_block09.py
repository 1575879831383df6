import pytorch_lightning as pl
from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy

class LitModel(pl.LightningModule):
    def __init__(self, config):
        super().__init__()
        self.model = create_model(config)
        self.save_hyperparameters(config)

    def training_step(self, batch, batch_idx):
        outputs = self.model(batch["input"])
        loss = criterion(outputs, batch["target"])
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


# DDP training
trainer = pl.Trainer(
    accelerator="gpu",
    devices=4,  # 4 GPUs
    strategy="ddp",
    precision="16-mixed",
    max_epochs=100,
)

# FSDP training for large models
trainer = pl.Trainer(
    accelerator="gpu",
    devices=4,
    strategy=FSDPStrategy(
        sharding_strategy="FULL_SHARD",
        mixed_precision="bf16",
    ),
    precision="bf16-mixed",
)

# Multi-node
trainer = pl.Trainer(
    accelerator="gpu",
    devices=4,
    num_nodes=2,
    strategy="ddp",
)

trainer.fit(model, train_loader)
