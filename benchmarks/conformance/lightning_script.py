"""Conformance script: Lightning `Trainer` (benchmarks/conformance; see common.py).

Written the way Lightning's docs save and resume:
- https://lightning.ai/docs/pytorch/stable/common/checkpointing_intermediate.html
  (`ModelCheckpoint(dirpath=..., every_n_train_steps=N, save_top_k=-1, save_last=True)`);
- https://lightning.ai/docs/pytorch/stable/common/checkpointing_basic.html ("Resume
  training state": `trainer.fit(model, datamodule, ckpt_path=...)`, here `last.ckpt`);
- https://lightning.ai/docs/pytorch/stable/common/trainer.html (`accumulate_grad_batches`,
  `deterministic`, `max_epochs`); `seed_everything(seed)` seeds the DistributedSampler
  Lightning inserts (`PL_GLOBAL_SEED`) and the dropout RNG;
- under `torchrun` Lightning detects torchelastic and checks `devices * num_nodes` against
  WORLD_SIZE (lightning_fabric/plugins/environments/torchelastic.py), so devices=W.

The training loop is Lightning's: the script only records. `training_step` records each
micro-batch's sample indices (the batch's first element) and loss; `on_train_batch_end`
records an optimizer step whenever `trainer.global_step` (Lightning's optimizer-step
counter) moved; the kill runs in `on_after_backward` of the micro-batch after step K.
The loader is a plain DataLoader, as the guides write it (Lightning's own warning says a
plain loader does not resume mid-epoch: training_epoch_loop.py, "not resumable").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


class Data(L.LightningDataModule):
    def __init__(self, args) -> None:
        super().__init__()
        self.args = args

    def train_dataloader(self) -> DataLoader:
        data = common.IndexedData()
        if self.args.no_shuffle:
            # Lightning's own DistributedSampler always shuffles the training loader
            # (trainer/connectors/data_connector.py, _process_dataloader: is_shuffled =
            # True); its docs' way out: use_distributed_sampler=False and your own sampler.
            sampler = DistributedSampler(data, num_replicas=self.trainer.world_size,
                                         rank=self.trainer.global_rank, shuffle=False)
            return DataLoader(data, batch_size=self.args.batch_size, sampler=sampler,
                              num_workers=self.args.workers)
        # Lightning replaces the sampler with a DistributedSampler (seed: PL_GLOBAL_SEED).
        return DataLoader(data, batch_size=self.args.batch_size, shuffle=True,
                          num_workers=self.args.workers)


class Task(L.LightningModule):
    def __init__(self, args) -> None:
        super().__init__()
        self.args = args
        self.model = common.make_model(args.dropout)
        self.trace: common.Trace | None = None
        self.last_step = 0
        self.kill_pending = False

    def setup(self, stage: str) -> None:
        self.trace = common.Trace(self.args.out, self.global_rank, self.args.life)

    def on_train_start(self) -> None:
        self.last_step = self.trainer.global_step  # restored from the checkpoint on resume

    def training_step(self, batch, batch_idx):
        indices, x, y = batch
        loss = common.loss_fn(self.model(x), y)
        self.trace.micro(indices, loss)
        return loss

    def on_after_backward(self) -> None:
        if self.kill_pending:  # one micro-batch forward and backward after step K
            common.kill_now()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        step = self.trainer.global_step
        if step != self.last_step:  # an optimizer step ended with this micro-batch
            self.last_step = step
            self.trace.step(step)
            if step == self.args.kill_after_step:
                self.kill_pending = True

    def on_train_end(self) -> None:
        if self.kill_pending:  # step K was the last one: nothing left to run
            common.kill_now()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.args.lr)
        if not self.args.scheduler:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}


def main() -> None:
    args = common.parser("lightning").parse_args()
    out = Path(args.out)
    checkpoints = out / "checkpoints"
    L.seed_everything(args.seed)

    callbacks = []
    if args.checkpoint_every:
        callbacks.append(ModelCheckpoint(dirpath=checkpoints, filename="{step}",
                                         every_n_train_steps=args.checkpoint_every,
                                         save_top_k=-1, save_last=True))
    try:
        trainer = L.Trainer(
            accelerator="cpu", devices=int(os.environ.get("WORLD_SIZE", "1")), num_nodes=1,
            strategy=args.strategy, max_epochs=args.epochs,
            use_distributed_sampler=not args.no_shuffle,
            accumulate_grad_batches=args.grad_accum, callbacks=callbacks,
            enable_checkpointing=bool(args.checkpoint_every), deterministic=True,
            logger=False, enable_progress_bar=False, enable_model_summary=False,
            default_root_dir=out, num_sanity_val_steps=0)
    except ValueError as error:
        if args.strategy != "fsdp":
            raise
        common.refuse(f"Lightning Trainer(strategy={args.strategy!r}, accelerator='cpu'): "
                      f"{error}")

    ckpt_path = None
    if args.resume:
        last = checkpoints / "last.ckpt"
        if last.exists():
            ckpt_path = str(last)
        else:
            print(f"[lightning] --resume: no {last}, starting fresh", file=sys.stderr)

    task = Task(args)
    trainer.fit(task, datamodule=Data(args), ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        common.save_final(out, task.model.state_dict())


if __name__ == "__main__":
    main()
