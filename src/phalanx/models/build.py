"""Building the built-in model from a Phalanx config (training, export, bench)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.models.minigpt import GPTConfig, MiniGPT

if TYPE_CHECKING:
    from phalanx.config.sections import Config


def gpt_config(cfg: Config) -> GPTConfig:
    """The MiniGPT shape a config's `[model]` section describes."""
    m = cfg.model
    return GPTConfig(block_size=m.block_size, n_layer=m.n_layer, n_head=m.n_head,
                     n_embd=m.n_embd, dropout=m.dropout, bias=m.bias,
                     activation_checkpointing=m.activation_checkpointing)


def build_model(cfg: Config) -> MiniGPT:
    """MiniGPT initialised from the config's seed alone (identical on every rank, and
    independent of the caller's RNG state)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        return MiniGPT(gpt_config(cfg))

