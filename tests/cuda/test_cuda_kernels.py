"""The fast paths on a GPU: SDPA's flash and memory-efficient kernels run MiniGPT's
attention (restricted to each one, the forward and backward succeed and every attention
output and gradient agrees with the math kernel's: compare.py), and `--compile` trains to the same losses as eager, without graph breaks."""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import scenario

pytestmark = pytest.mark.cuda

COMPILE_RTOL = 2e-2  # per-step loss, compiled vs eager (bf16; inductor fuses differently)
COMPILE_STEPS = 30


@pytest.fixture(scope="module")
def sdpa(tmp_path_factory):
    return scenario("sdpa", tmp_path_factory.mktemp("sdpa"))


@pytest.mark.parametrize("kernel", ["flash_attention", "efficient_attention"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_each_fused_attention_kernel_runs_the_model(sdpa, kernel, dtype, figure):
    major, _ = torch.cuda.get_device_capability()
    if kernel == "flash_attention" and major < 8:
        pytest.skip(f"flash attention needs sm80+; this GPU is sm{major}x")
    got, math = sdpa[f"{kernel}/{dtype}"], sdpa[f"math/{dtype}"]
    assert got["ok"], f"SDPA restricted to {kernel} failed: {got.get('error')}"
    assert math["ok"], math.get("error")
    # every attention output and gradient, not the loss (compare.py: a kernel that
    # zeroes attention moves a fresh model's loss by 0.015 %)
    assert got["mismatches"] == [], got["mismatches"]
    figure(f"sdpa {kernel} {dtype}", loss=got["loss"], math_loss=math["loss"],
           worst_relative_error=got["worst"], default_kernels=sdpa["default_kernels"])


def test_the_default_choice_is_a_fused_kernel(sdpa):
    """With no restriction, torch picks flash, memory-efficient or cuDNN attention —
    never the unfused math path (which materialises the T×T scores)."""
    fused = ("flash", "fmha", "efficient", "cudnn")
    assert any(w in k.lower() for k in sdpa["default_kernels"] for w in fused), \
        sdpa["default_kernels"]


def test_compile_trains_as_eager_without_graph_breaks(tmp_path, figure):
    got = scenario("compiled", tmp_path, steps=COMPILE_STEPS)
    eager, compiled = got["eager"]["losses"], got["compiled"]["losses"]
    assert len(eager) == len(compiled) == COMPILE_STEPS
    pairs = list(zip(eager, compiled))
    assert all(abs(a - b) <= COMPILE_RTOL * abs(a) for a, b in pairs), pairs
    assert got["fullgraph"]["ok"], f"MiniGPT's forward has a graph break: " \
                                   f"{got['fullgraph'].get('error')}"
    figure("torch.compile", steps=COMPILE_STEPS, eager_s=got["eager"]["seconds"],
           compiled_s=got["compiled"]["seconds"],
           worst_loss_rel=max(abs(a - b) / abs(a) for a, b in pairs))
