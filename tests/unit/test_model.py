"""MiniGPT: shapes, weight tying, the FLOP formula against a hand count."""

from __future__ import annotations

import torch

from phalanx.models import GPTConfig, MiniGPT


def test_forward_shapes_and_tied_head():
    model = MiniGPT(GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(0, 256, (3, 16))
    logits, loss = model(x, x)
    assert logits.shape == (3, 16, 256) and loss.ndim == 0
    assert model.lm_head.weight is model.wte.weight


def test_flops_per_token_matches_a_hand_count():
    cfg = GPTConfig(block_size=64, n_layer=2, n_head=4, n_embd=32)
    model = MiniGPT(cfg)
    C, L, V = 32, 2, 256
    # per block: LN(C) + qkv(3C·C) + proj(C·C) + LN(C) + fc(4C·C) + proj(4C·C); no biases
    per_block = C + 3 * C * C + C * C + C + 4 * C * C + 4 * C * C
    n = V * C + L * per_block + C  # wte (tied head) + blocks + ln_f; wpe excluded
    assert model.num_params() == n
    assert model.flops_per_token() == 6 * n + 12 * L * 4 * (C // 4) * 64


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    a = MiniGPT(GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=16))
    b = MiniGPT(GPTConfig(block_size=8, n_layer=2, n_head=2, n_embd=16,
                          activation_checkpointing=True))
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 256, (2, 8))
    for m in (a, b):
        m(x, x)[1].backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6), name
