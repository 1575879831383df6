"""The CUDA tier's comparisons (tests/cuda/compare.py) catch what they are for, shown on
the CPU: a "fused kernel" that zeroes the attention output, whose loss stays within the
old 1 % of the math kernel's, is caught on the attention outputs and gradients; a loss
scaler that never acts is caught from the state a checkpoint records."""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.amp.grad_scaler import _refresh_per_optimizer_state

sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
import compare  # noqa: E402

from phalanx.models.minigpt import GPTConfig, MiniGPT  # noqa: E402


@pytest.fixture(scope="module")
def model_and_batch():
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=32))
    x = torch.randint(0, 64, (2, 32))
    return model, x, torch.roll(x, -1, 1)


@contextlib.contextmanager
def zeroed_attention():
    """A broken kernel: SDPA's output × 0."""
    real = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = lambda *a, **k: real(*a, **k) * 0
    try:
        yield
    finally:
        F.scaled_dot_product_attention = real


@pytest.mark.parametrize("dtype", [torch.bfloat16])  # CPU autocast: bf16
def test_a_kernel_that_zeroes_attention_is_caught(model_and_batch, dtype):
    model, x, y = model_and_batch
    ref = compare.attention_and_grads(model, x, y, contextlib.nullcontext, dtype)
    same = compare.attention_and_grads(model, x, y, contextlib.nullcontext, dtype)
    assert compare.kernel_mismatches(same, ref, dtype) == []
    broken = compare.attention_and_grads(model, x, y, zeroed_attention, dtype)
    old = abs(broken["loss"] - ref["loss"]) / abs(ref["loss"])
    assert old <= 1e-2, old  # the old check (loss within 1 %) let it pass
    found = compare.kernel_mismatches(broken, ref, dtype)
    assert any(f.startswith("attention ") for f in found), found
    assert any(f.startswith("grad ") for f in found), found


def fp16_scaler_state(steps: int, stuck: bool, init_scale: float = 2.0 ** 24,
                      spread: float = 1e3) -> dict:
    """A few fp16 steps of a tiny model through torch's GradScaler from `init_scale` (from
    2**24 its first steps overflow); `stuck`: a scaler whose update never acts."""
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    if stuck:  # forgets the step's overflow record, never touches the scale
        scaler.update = lambda new_scale=None: setattr(  # type: ignore[method-assign]
            scaler, "_per_optimizer_states", defaultdict(_refresh_per_optimizer_state))
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = net(torch.randn(4, 8) * spread).square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return scaler.state_dict()


def test_a_loss_scaler_that_never_acts_is_caught():
    assert compare.scaler_stuck(fp16_scaler_state(4, stuck=False), 2.0 ** 24, 4) is None
    # no overflow, growth interval not reached: the scale stays, every step counted
    calm = fp16_scaler_state(4, stuck=False, init_scale=1.0, spread=1.0)
    assert calm["scale"] == 1.0 and compare.scaler_stuck(calm, 1.0, 4) is None, calm
    for init in (2.0 ** 24, 1.0):
        stuck = fp16_scaler_state(4, stuck=True, init_scale=init, spread=1.0)
        said = compare.scaler_stuck(stuck, init, 4)
        assert said is not None and "never acted" in said, said
