"""The same training step written four ways: a plain hand-written DDP loop (seed 002's
style), Hugging Face Accelerate, Lightning Fabric, and Phalanx's trainer.

Each `setup(cfg, tokens, run)` (`tokens`: the corpus's TokenSplits) returns `step()`: one optimizer step of `grad_accum`
micro-batches of `micro_batch_size` windows, AdamW, gradient clipping — same model
(MiniGPT from the config's seed), same data, same ranks and threads, same process group
(the peers find it already initialised and use it).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from contextlib import contextmanager

import torch

from phalanx.data import TokenWindows
from phalanx.models import build_model
from phalanx.runtime.optim import adamw
from phalanx.runtime.train_step import micro_steps, optimizer_step

PEERS = ("plain", "accelerate", "fabric", "phalanx")
PACKAGES = {"accelerate": "accelerate", "fabric": "lightning"}


def available(name: str) -> bool:
    try:
        importlib.metadata.version(PACKAGES.get(name, "torch"))
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def versions() -> dict[str, str]:
    out: dict[str, str] = {"torch": torch.__version__}
    for name, package in PACKAGES.items():
        if available(name):
            out[package] = importlib.metadata.version(package)
    return out


def _loader(cfg, tokens, rank: int, world: int):
    from torch.utils.data import DataLoader, DistributedSampler


    ds = TokenWindows(tokens.load("train"), cfg.model.block_size)
    sampler: DistributedSampler = DistributedSampler(ds, num_replicas=world, rank=rank,
                                                     shuffle=True, drop_last=True)
    return DataLoader(ds, batch_size=cfg.train.micro_batch_size, sampler=sampler)


def _forever(loader):
    """Batches across epochs, reshuffled each epoch as a correct loop does."""
    epoch = 0
    while True:
        target = loader if hasattr(loader, "set_epoch") else getattr(loader, "sampler", None)
        if target is not None and hasattr(target, "set_epoch"):
            target.set_epoch(epoch)
        yield from loader
        epoch += 1


def plain(cfg, tokens, run):
    """What the field guides write by hand: DDP(model), AdamW, DistributedSampler."""
    from torch.nn.parallel import DistributedDataParallel as DDP


    model = DDP(build_model(cfg, tokens.vocab_size).to(run.device))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    batches = _forever(_loader(cfg, tokens, run.rank, run.world_size))
    k = cfg.train.grad_accum

    def step():
        for _ in range(k):
            x, y = next(batches)
            _, loss = model(x.to(run.device), y.to(run.device))
            (loss / k).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def accelerate(cfg, tokens, run):
    from accelerate import Accelerator


    acc = Accelerator(gradient_accumulation_steps=cfg.train.grad_accum, cpu=run.device.type == "cpu")
    model = build_model(cfg, tokens.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    model, opt, loader = acc.prepare(model, opt, _loader(cfg, tokens, run.rank, run.world_size))
    batches = _forever(loader)

    def step():
        for _ in range(cfg.train.grad_accum):
            x, y = next(batches)
            with acc.accumulate(model):
                _, loss = model(x, y)
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
    return step


def fabric(cfg, tokens, run):
    from lightning.fabric import Fabric


    fab = Fabric(accelerator="cuda" if run.device.type == "cuda" else "cpu",
                 devices=run.local_world_size, num_nodes=run.world_size // run.local_world_size,
                 strategy="ddp")
    fab.launch()  # under torchrun/Phalanx's agent: joins the existing group, spawns nothing
    model = build_model(cfg, tokens.vocab_size)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    model, opt = fab.setup(model, opt)
    batches = _forever(fab.setup_dataloaders(_loader(cfg, tokens, run.rank, run.world_size),
                                             use_distributed_sampler=False))
    k = cfg.train.grad_accum

    def step():
        for i in range(k):
            x, y = next(batches)
            with fab.no_backward_sync(model, enabled=i < k - 1):
                _, loss = model(x, y)
                fab.backward(loss / k)
        fab.clip_gradients(model, opt, max_norm=cfg.train.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def phalanx(cfg, tokens, run, *, ddp: dict | None = None, fused: bool | None = None,
            strategy=None):
    """The built-in trainer's own step: run.setup/loader/accumulate + the loop's functions.

    For this setup only, `ddp` overrides strategy options and `fused` the AdamW choice
    (how `--defaults` times each default against torch's), and `strategy` replaces the
    run's strategy (how `--scaling` times one rank alone inside a larger launch).
    """

    t = cfg.train
    with _swapped_strategy(run, strategy, ddp or {}):
        model, opt = run.setup(build_model(cfg, tokens.vocab_size), lambda p: adamw(
            p, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
            device=run.device, fused=fused), precision=t.precision)
        acc = run.accumulate(model, t.grad_accum)
        precision = run.precision
    batches = iter(run.loader(TokenWindows(tokens.load("train"), cfg.model.block_size), t.micro_batch_size,
                              stream=True))

    def step():
        micro_steps(model, acc, batches, precision)
        run.checkpoint_staged()
        optimizer_step(run, model, opt, t.grad_clip)
    step.__dict__.update(  # attributes of the function, for the profiler
        model=model, acc=acc, opt=opt, batches=batches, precision=precision,
        grad_clip=t.grad_clip, run=run, strategy=run.strategy if strategy is None else strategy)
    return step


@contextmanager
def _swapped_strategy(run, strategy, overrides: dict):
    saved = run.strategy
    using = run.strategy = strategy or saved
    options = using.options
    using.options = dataclasses.replace(options, **overrides)
    try:
        yield
    finally:
        using.options = options
        run.strategy = saved


SETUPS = {"plain": plain, "accelerate": accelerate, "fabric": fabric, "phalanx": phalanx}
