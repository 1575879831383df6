"""Building the model a Phalanx config names (training, export, plan, bench): MiniGPT
from the `[model]` flags, or the user's own from `--model pkg.module:factory`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phalanx.models.minigpt import GPTConfig, MiniGPT

if TYPE_CHECKING:
    import torch.nn as nn

    from phalanx.config.sections import Config


def gpt_config(cfg: Config, vocab_size: int = 256) -> GPTConfig:
    """The MiniGPT shape a config's `[model]` section describes, for a tokenizer of
    `vocab_size` tokens."""
    m = cfg.model
    return GPTConfig(vocab_size=vocab_size, block_size=m.block_size, n_layer=m.n_layer,
                     n_head=m.n_head, n_embd=m.n_embd, dropout=m.dropout, bias=m.bias,
                     activation_checkpointing=m.activation_checkpointing, rope=m.rope,
                     qk_norm=m.qk_norm, activation=m.activation,
                     tie_embeddings=m.tie_embeddings, logit_softcap=m.logit_softcap)


def build_model(cfg: Config, vocab_size: int = 256) -> nn.Module:
    """The run's model, initialised from the config's seed alone (identical on every rank,
    and independent of the caller's RNG state): the user's factory's module when
    `--model` is given (adapted to `logits, loss = model(x, y)`: `models.adapter`),
    MiniGPT otherwise."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.train.seed)
        if cfg.model.factory is not None:
            from phalanx.models.user import build_user_model

            return build_user_model(cfg.model.factory, vocab_size, cfg.model.block_size)
        return MiniGPT(gpt_config(cfg, vocab_size))


def model_name(cfg: Config) -> str:
    """How the banner and reports name the model: `MiniGPT 4L × 4H × 128d` or the factory."""
    m = cfg.model
    if m.factory is not None:
        return f"yours ({m.factory})"
    levers = [name for name, on in (("rope", m.rope), ("qk-norm", m.qk_norm),
                                    ("relu²", m.activation == "relu2"),
                                    ("untied head", not m.tie_embeddings),
                                    (f"soft-cap {m.logit_softcap:g}", m.logit_softcap))
              if on]
    return f"MiniGPT {m.n_layer}L × {m.n_head}H × {m.n_embd}d" + "".join(
        f", {lever}" for lever in levers)
