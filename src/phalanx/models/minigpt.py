"""MiniGPT: a GPT-2-style decoder in one file, nanoGPT-style.

Pre-norm blocks, causal self-attention through `F.scaled_dot_product_attention` (flash /
memory-efficient kernels where the device has them), GELU MLP, learned positions,
and the output head tied to the token embedding — GPT-2's architecture. Each of the
GPT-2 speedrun's levers (modded-nanogpt) is an option of `GPTConfig`: rotary positions
instead of learned ones, QK-norm (RMS-normalised queries and keys), ReLU² in the MLP, an
untied output head and tanh soft-capping of the logits. `phalanx train`'s default uses
the ones the time-to-quality benchmark found to win (docs/time-to-quality.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from phalanx.config.layout import minigpt_tp_refusal, stage_blocks


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    activation_checkpointing: bool = False
    rope: bool = False  # rotary position embeddings (no learned position table)
    qk_norm: bool = False  # RMS-normalise queries and keys per head
    activation: str = "gelu"  # MLP nonlinearity: gelu or relu2 (ReLU squared)
    tie_embeddings: bool = True  # the output head shares the token embedding
    logit_softcap: float = 0.0  # logits → c·tanh(logits / c); 0: off


class Rotary(nn.Module):
    """Rotary position embedding (RoFormer): each pair of a head's channels is rotated by
    an angle proportional to the position. The tables are buffers, not state."""

    def __init__(self, head_dim: int, block_size: int, base: float = 10000.0) -> None:
        super().__init__()
        self.shape = (head_dim, block_size, base)
        cos, sin = self._tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim, block_size, base = self.shape
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(torch.arange(block_size, dtype=torch.float32), inv)
        return angles.cos(), angles.sin()

    def reset_parameters(self) -> None:
        """The tables again (a model built on the meta device gets its storage empty)."""
        cos, sin = self._tables()
        with torch.no_grad():
            cast(torch.Tensor, self.cos).copy_(cos)
            cast(torch.Tensor, self.sin).copy_(sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, nh, T, hs)
        T = x.size(-2)
        cos, sin = cast(torch.Tensor, self.cos), cast(torch.Tensor, self.sin)
        cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attend(nn.Module):
    """Causal attention of q, k, v by heads (B, nh, T, hs), with dropout on the attention
    weights: a module of its own so that tensor parallelism can give it each rank's own
    random stream (its heads are that rank's: `models.tp_styles.ForkRNGByRank`)."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.core = Attend(cfg.dropout)
        self.qk_norm = cfg.qk_norm
        self.rotary = Rotary(cfg.n_embd // cfg.n_head, cfg.block_size) if cfg.rope else None
        # q, k, v by head (B, T, 3, nh, hs) → the heads this rank computes: all of them,
        # or under tensor parallelism its own (the plan's style on this module)
        self.heads = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        qkv = self.heads(self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head))
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # (B, nh, T, hs) each
        if self.qk_norm:
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        y = self.core(q, k, v).transpose(1, 2).contiguous().view(B, T, -1)  # (B, T, C of the heads here)
        return self.resid_dropout(self.c_proj(y))


def whole(t: torch.Tensor) -> torch.Tensor:
    """`t` as a plain tensor: a DTensor (tensor parallelism's split logits, its loss)
    gathered, differentiably; a plain tensor as it is. (Asked by its method, not by
    isinstance: importing DTensor costs about a second in every process that builds a model,
    and only a tensor-parallel one ever meets it.)"""
    full = getattr(t, "full_tensor", None)
    return full() if callable(full) else t


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.relu2 = cfg.activation == "relu2"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        h = F.relu(h).square() if self.relu2 else F.gelu(h)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class MiniGPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.stage: tuple[int, int] | None = None  # (stage, stages): see keep_stage
        # (None on a pipeline stage that does not hold them: `keep_stage`)
        self.wte: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = None if cfg.rope else nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks: nn.ModuleList | nn.ModuleDict = nn.ModuleList(
            Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            lm_head.weight = self.wte.weight  # weight tying
        self.lm_head: nn.Linear | None = lm_head
        self.init_weights()

    def init_weights(self) -> None:
        """GPT-2's initialisation (also what a model built on the meta device gets: its
        storage first, then this — `strategies.start.initialise`)."""
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, (nn.LayerNorm, Rotary)):  # (their own: ones, zeros, tables)
            module.reset_parameters()

    def tp_plan(self, tp: int = 1) -> dict:
        """Tensor parallelism (torch's `parallelize_module` styles, by module name):
        each block's attention output projection and MLP split Megatron-style (columns,
        then rows: one all-reduce each, forward and backward); `c_attn` — q, k and v fused in
        one matrix, which a column split would mix — stays whole on every rank, and its
        output is split by heads (`heads`), so each rank attends with its own heads and
        draws their attention-dropout masks from its own stream (`core`); dropout on
        replicated activations draws the same masks on every rank of the group (they are
        seeded alike: `Run.seed_step`). When `tp` divides the vocabulary, the token
        embedding is split by rows and the head by columns — both over the vocabulary, so
        a tied pair stays one weight — and the head's logits stay split: the cross-entropy
        runs on the shards under torch's `loss_parallel` (`forward`). The position
        embedding and the norms stay whole."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleOutput,
            RowwiseParallel,
        )

        from phalanx.models.tp_styles import ForkRNGByRank

        plan: dict = {}
        for i in self._block_names():  # (a pipeline stage's own: `keep_stage`)
            plan[f"blocks.{i}.attn.heads"] = PrepareModuleOutput(
                output_layouts=Replicate(), desired_output_layouts=Shard(3))
            plan[f"blocks.{i}.attn.core"] = ForkRNGByRank()  # its dropout: own heads, own masks
            plan[f"blocks.{i}.attn.c_proj"] = RowwiseParallel()
            plan[f"blocks.{i}.mlp.c_fc"] = ColwiseParallel()
            plan[f"blocks.{i}.mlp.c_proj"] = RowwiseParallel()
        if self.config.vocab_size % tp == 0 and self.stage is None:  # loss parallel
            plan["wte"] = RowwiseParallel(input_layouts=Replicate())
            plan["lm_head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
        return plan

    def _block_names(self) -> list[str]:
        return list(self.blocks.keys()) if isinstance(self.blocks, nn.ModuleDict) \
            else [str(i) for i in range(len(self.blocks))]

    def keep_stage(self, stage: int, stages: int) -> None:
        """Pipeline parallelism: keep pipeline stage `stage` of `stages` only — its blocks
        (`config.layout.stage_blocks`), the embeddings on the first, the final norm and the
        head on the last — each under its whole-model name, so that a stage's state dict
        is its part of the whole model's (a checkpoint reshards between layouts). The
        forward then maps the previous stage's activations (ids, on the first) to the next
        stage's (logits, on the last): what torch's pipeline schedules pass."""
        if self.config.tie_embeddings and stages > 1:
            raise ValueError("a tied embedding and head cannot be split into pipeline stages")
        blocks = list(self.blocks.children())
        self.blocks = nn.ModuleDict({str(i): blocks[i]
                                     for i in stage_blocks(len(blocks), stages, stage)})
        if stage > 0:
            self.wte, self.wpe = None, None
        if stage < stages - 1:
            self.ln_f, self.lm_head = None, None
        self.stage = (stage, stages)

    def _stage_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wte is not None:  # the first stage: token ids in
            x = self.drop(self._embed(x))
        x = self._blocks(x)
        return x if self.lm_head is None else self._head(x)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm, the head, and the logit soft-cap if any: (B, T, vocab)."""
        assert self.lm_head is not None and self.ln_f is not None  # (whole, or last stage)
        logits = self.lm_head(self.ln_f(x))
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits.float() / cap) if cap else logits

    def _embed(self, idx: torch.Tensor) -> torch.Tensor:
        assert self.wte is not None  # (the whole model, or the first stage)
        x = self.wte(idx)  # (B, T, C)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.size(1), device=idx.device))
        return x

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        blocks = self.blocks.values() if isinstance(self.blocks, nn.ModuleDict) else self.blocks
        for block in blocks:
            if self.config.activation_checkpointing and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x

    def tp_refusal(self, tp: int) -> str | None:
        """Why this configuration cannot be split over `tp` ranks (None: it can)."""
        return minigpt_tp_refusal(self.config.n_head, tp)

    def num_params(self, non_embedding: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding and self.wpe is not None else n

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if self.stage is not None:  # one pipeline stage (`keep_stage`): no loss here
            return self._stage_forward(idx)
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        logits = self._head(self._blocks(self.drop(self._embed(idx))))  # (B, T, vocab)
        if targets is None:
            return whole(logits), None
        # (logits split over the vocabulary, under tensor parallelism: the cross-entropy on
        # the shards inside torch's `loss_parallel`, which the trainer's micro-step holds
        # around forward and backward; outside it DTensor gathers them first)
        targets = targets.view(B * T)
        mesh = getattr(logits, "device_mesh", None)
        if mesh is not None:  # (the same ids on every rank of the tp group)
            from torch.distributed.tensor import DTensor, Replicate

            targets = DTensor.from_local(targets, mesh, [Replicate()], run_check=False)
        loss = F.cross_entropy(logits.float().view(B * T, -1), targets)
        return logits, whole(loss)

    def flops_per_token(self) -> int:
        """Training FLOPs per token, PaLM appendix B: 6·N + 12·L·H·Q·T.

        N = non-embedding parameters (forward 2N + backward 4N multiply-adds counted as
        FLOPs), plus attention scores and values: 12 · n_layer · n_head · head_dim · T.
        """
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd // cfg.n_head, cfg.block_size
        return 6 * self.num_params() + 12 * L * H * Q * T

    def estimate_mfu(self, tokens_per_s: float, peak_flops: float) -> float:
        """Model FLOPs utilisation: achieved (flops_per_token × tokens/s) over peak FLOP/s."""
        return self.flops_per_token() * tokens_per_s / peak_flops

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8,
                 top_k: int | None = 40, generator: torch.Generator | None = None):
        return generate(self, self.config.block_size, idx, max_new_tokens, temperature,
                        top_k, generator)


@torch.no_grad()
def generate(model, block_size: int, idx: torch.Tensor, max_new_tokens: int,
             temperature: float = 0.8, top_k: int | None = 40,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """`max_new_tokens` sampled after `idx` from `logits, _ = model(last block_size ids)`
    (top-k, temperature): MiniGPT's, and a `--model` factory's through `models.adapter`."""
    for _ in range(max_new_tokens):
        logits, _ = model(idx[:, -block_size:])
        logits = logits[:, -1, :].float() / temperature
        if top_k is not None:
            v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
            logits[logits < v[:, [-1]]] = -float("inf")
        probs = F.softmax(logits, dim=-1)
        idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
    return idx
