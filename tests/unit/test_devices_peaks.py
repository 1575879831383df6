"""The dense bf16 peak table (runtime/peaks.py): names as torch.cuda.get_device_name()
gives them, each variant to its own figure, and no figure for a device not in it."""

from __future__ import annotations

import pytest

from phalanx.plan.devices import GPUS, device
from phalanx.runtime.peaks import mfu, peak_for, unknown_reason

NAMES = [  # torch.cuda.get_device_name() strings → (row, TFLOP/s)
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756),
    ("NVIDIA H100 NVL", "H100 NVL", 835),
    ("NVIDIA H200", "H200 SXM", 989),
    ("NVIDIA H200 NVL", "H200 NVL", 835),
    ("NVIDIA GH200 480GB", "GH200", 989),
    ("NVIDIA A100-SXM4-80GB", "A100", 312),
    ("NVIDIA A100-PCIE-40GB", "A100", 312),
    ("NVIDIA A100 80GB PCIe", "A100", 312),
    ("NVIDIA L4", "L4", 121),
    ("NVIDIA L40S", "L40S", 362),
    ("NVIDIA L40", "L40", 181),
    ("NVIDIA A10", "A10", 125),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2),
    ("NVIDIA GeForce RTX 3090", "RTX 3090", 71),
]


@pytest.mark.parametrize("name,row,tflops", NAMES)
def test_each_device_name_gets_its_own_peak(name, row, tflops):
    peak = peak_for(name)
    assert peak is not None and peak.device == row
    assert peak.bf16_flops == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("name", ["NVIDIA A10G", "Tesla V100-SXM2-16GB", "Tesla T4", "CPU",
                                  "NVIDIA H100", "NVIDIA H20", "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                                  "NVIDIA B200"])
def test_an_unknown_device_or_a_mig_slice_has_no_peak_and_no_mfu(name):
    assert peak_for(name) is None
    assert mfu(1e5, 1e9, name) is None
    assert name in unknown_reason(name)


def test_an_h100_is_never_given_an_a100_figure():
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"):
        assert peak_for(name).device.startswith("H100")


def test_mfu_is_model_flops_over_the_devices_peak():
    # 100k tokens/s at 1 GFLOP/token = 1e14 FLOP/s, on two H100 SXM: 1e14 / 1.978e15
    assert mfu(1e5, 1e9, "NVIDIA H100 80GB HBM3", 2) == pytest.approx(1e14 / (2 * 989e12))


def test_the_planners_devices_take_their_peak_from_the_table():
    assert device("H100").peak_flops == peak_for("NVIDIA H100 80GB HBM3").bf16_flops
    assert device("a100-80g").peak_flops == 312e12 and device("l4").peak_flops == 121e12
    assert set(GPUS) == {"h100", "h200", "a100-80g", "a100-40g", "l4"}


def test_a_laptop_part_or_another_variant_of_a_desktop_card_gets_no_peak():
    assert peak_for("NVIDIA GeForce RTX 4090").bf16_flops == 165.2e12
    assert peak_for("NVIDIA GeForce RTX 3090").bf16_flops == 71e12
    for other in ("NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 4090 D",
                  "NVIDIA GeForce RTX 3090 Ti"):
        assert peak_for(other) is None, other
