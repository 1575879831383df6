"""Users' language models for `phalanx train --model` (not MiniGPT): the tests copy this
file into a package of the current directory (`mylm/model.py`) and name its factories.

`conv_lm`: a causal convolution mixer — token embedding, two residual blocks (a causal
depthwise convolution over time, then an MLP) in a ModuleList (FSDP's blocks), and an
output head tied to the embedding; its forward returns the logits tensor.
`hf_style`: returns an object with `.logits` and takes `labels` (as Hugging Face's).
`with_targets`: nanoGPT's convention, `forward(idx, targets=None) -> (logits, loss)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


class CausalConvBlock(nn.Module):
    def __init__(self, width: int, kernel: int = 3) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.conv = nn.Conv1d(width, width, kernel, groups=width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x).transpose(1, 2)  # (B, C, T)
        h = self.conv(F.pad(h, (self.kernel - 1, 0)))  # sees only the past
        x = x + h.transpose(1, 2)
        return x + self.mlp(self.norm2(x))


class ConvLM(nn.Module):
    def __init__(self, vocab_size: int, width: int = 24, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.layers = nn.ModuleList(CausalConvBlock(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)  # (B, T, C)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))  # (B, T, vocab)


def conv_lm(vocab_size: int, block_size: int) -> ConvLM:
    assert block_size > 0
    return ConvLM(vocab_size)


@dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor | None = None


class HFStyle(ConvLM):
    def forward(self, input_ids, labels=None, **kwargs):  # type: ignore[override]
        logits = super().forward(input_ids)
        loss = None if labels is None else F.cross_entropy(  # HF shifts the labels itself
            logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return Output(logits, loss)


def hf_style(**kwargs):
    return HFStyle(kwargs["vocab_size"])


class WithTargets(ConvLM):
    calls_with_targets = 0

    def forward(self, idx, targets=None):  # type: ignore[override]
        logits = super().forward(idx)
        if targets is None:
            return logits, None
        WithTargets.calls_with_targets += 1
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def with_targets(vocab_size: int = 256):
    return WithTargets(vocab_size)


def wrong_vocab(vocab_size: int):
    return ConvLM(vocab_size + 1)


def raises(vocab_size: int):
    raise ValueError("no weights here")


def returns_int():
    return 3


class Fixed(nn.Module):
    """Zero logits: nothing to train (a buffer, or no tensor at all)."""

    def __init__(self, vocab_size: int, table: bool) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        if table:
            self.register_buffer("table", torch.zeros(vocab_size))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*idx.shape, self.vocab_size, device=idx.device)


def no_parameters(vocab_size: int):
    return Fixed(vocab_size, table=False)


def buffers_only(vocab_size: int):
    return Fixed(vocab_size, table=True)


def frozen(vocab_size: int):
    return ConvLM(vocab_size).requires_grad_(False)


class Cast(ConvLM):
    dtype = torch.long

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx).to(self.dtype)


def int_logits(vocab_size: int):
    return Cast(vocab_size)


def complex_logits(vocab_size: int):
    model = Cast(vocab_size)
    model.dtype = torch.complex64
    return model


def with_thread(vocab_size: int):
    """A model whose factory starts a thread that never ends (not a daemon)."""
    import threading

    threading.Thread(target=threading.Event().wait, name="users-own-thread").start()
    return ConvLM(vocab_size)


def tiny_llama(vocab_size: int, block_size: int):
    """A transformers Llama (built from a config: no download), for `--init-from`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=vocab_size, max_position_embeddings=block_size,
        bos_token_id=0, eos_token_id=0))
