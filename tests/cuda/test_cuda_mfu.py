"""Throughput and MFU on this GPU, against its own dense bf16 peak (runtime/peaks.py):
the device's name must be matched to its own row — or say plainly that it has none."""

from __future__ import annotations

import pytest
import torch
from cuda_helpers import scenario

from phalanx.runtime.peaks import peak_for, unknown_reason

pytestmark = pytest.mark.cuda


def test_this_device_has_its_own_peak_or_is_said_to_have_none(figure):
    name = torch.cuda.get_device_name()
    peak = peak_for(name)
    figure("device", device=name, row=None if peak is None else peak.device,
           peak_tflops=None if peak is None else peak.bf16_flops / 1e12,
           capability=".".join(map(str, torch.cuda.get_device_capability())))
    if peak is None:
        pytest.skip(unknown_reason(name))
    if "H100" in name.upper():
        assert peak.device.startswith("H100")  # never another device's figure


def test_gpt2_124m_bf16_mfu_is_physical(tmp_path, figure):
    got = scenario("throughput", tmp_path, steps=20, warmup=5)
    assert got["tokens_per_s"] > 0
    figure("throughput gpt2-124m bf16 eager mb 8", **got)
    if got["mfu"] is None:
        pytest.skip(got["no_mfu_reason"])
    assert 0.0 < got["mfu"] < 1.0, got  # above 1: a peak too low, or FLOPs over-counted
