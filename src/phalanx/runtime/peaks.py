"""Dense bf16 tensor-core peak FLOP/s per GPU, matched from `torch.cuda.get_device_name()`,
for MFU: model FLOPs per second over this device's own peak.

Dense means without 2:4 structured sparsity: NVIDIA's datasheets print the sparse figure
first (with an asterisk) and the dense one is half of it. The figures are for bf16 inputs
with fp32 accumulation (what torch's autocast runs); GeForce cards run fp16 accumulation
at twice that, which torch does not use. A name that matches none of the rows below — or
a MIG slice, which has a fraction of the streaming multiprocessors — has no peak here,
and then no MFU is reported: never the figure of another device.

Torch-free (names only), so the planner and the benchmark share it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    device: str  # the row's name, e.g. "H100 SXM"
    bf16_flops: float  # dense, per GPU
    source: str  # where the figure is printed


# (pattern on the upper-cased device name, row); the first match wins, so each variant of
# a GPU comes before the bare name. Sources: NVIDIA's datasheets, dense bf16 tensor core
# (the sparse figure halved where only that is printed):
#   H100 SXM 989 / PCIe 756 / NVL 835 (1,979 / 1,513 / 1,671 sparse): "NVIDIA H100 Tensor
#     Core GPU" datasheet, nvidia.com/en-us/data-center/h100/
#   H200 SXM 989 / NVL 835 (1,979 / 1,671 sparse): nvidia.com/en-us/data-center/h200/
#   GH200 989 (1,979 sparse): "NVIDIA GH200 Grace Hopper Superchip" datasheet
#   A100 312 (624 sparse), SXM and PCIe, 40 and 80 GB: "NVIDIA A100 Tensor Core GPU"
#     datasheet, nvidia.com/en-us/data-center/a100/
#   L4 121 (242 sparse): "NVIDIA L4 Tensor Core GPU" datasheet
#   L40S 362 (733 sparse): "NVIDIA L40S" datasheet; L40 181 (362 sparse): "NVIDIA L40"
#   A10 125 (250 sparse): "NVIDIA A10 Tensor Core GPU" datasheet
#   RTX 4090 165.2 (330.4 sparse; fp32 accumulate): "NVIDIA Ada GPU Architecture" whitepaper,
#     appendix table; RTX 3090 71 (142 sparse; fp32 accumulate): "NVIDIA Ampere GA102 GPU
#     Architecture" whitepaper
# The RTX rows match the desktop card's name exactly ('NVIDIA GeForce RTX 4090'): a
# laptop part, a 4090 D or a 3090 Ti is another chip configuration, another peak.
# Not here on purpose: A10G (AWS's variant; NVIDIA publishes no datasheet figure for it),
# V100 and T4 (no bf16 tensor cores), and anything not in a datasheet we have read.
_H100 = "nvidia.com/en-us/data-center/h100 datasheet"
_H200 = "nvidia.com/en-us/data-center/h200 datasheet"
ROWS: list[tuple[str, Peak]] = [
    (r"\bH100\b.*\bNVL\b", Peak("H100 NVL", 835e12, _H100)),
    (r"\bH100\b.*\bPCIE\b", Peak("H100 PCIe", 756e12, _H100)),
    (r"\bH100\b.*\b(SXM\w*|HBM3)\b", Peak("H100 SXM", 989e12, _H100)),
    (r"\bH200\b.*\bNVL\b", Peak("H200 NVL", 835e12, _H200)),
    (r"\bH200\b", Peak("H200 SXM", 989e12, _H200)),
    (r"\bGH200\b", Peak("GH200", 989e12, "NVIDIA GH200 datasheet")),
    (r"\bA100\b", Peak("A100", 312e12, "nvidia.com/en-us/data-center/a100 datasheet")),
    (r"\bL40S\b", Peak("L40S", 362e12, "NVIDIA L40S datasheet")),
    (r"\bL40\b", Peak("L40", 181e12, "NVIDIA L40 datasheet")),
    (r"\bL4\b", Peak("L4", 121e12, "NVIDIA L4 datasheet")),
    (r"\bA10\b", Peak("A10", 125e12, "NVIDIA A10 datasheet")),
    (r"\bRTX 4090$", Peak("RTX 4090", 165.2e12, "NVIDIA Ada architecture whitepaper")),
    (r"\bRTX 3090$", Peak("RTX 3090", 71e12, "NVIDIA GA102 architecture whitepaper")),
]


def peak_for(device_name: str) -> Peak | None:
    """The row for a `torch.cuda.get_device_name()` string ('NVIDIA H100 80GB HBM3',
    'NVIDIA A100-SXM4-80GB', 'NVIDIA L4'), or None: not a GPU we have a datasheet figure
    for (a bare 'H100' that names no variant, a MIG slice, a CPU)."""
    name = device_name.strip().upper().replace("-", " ").replace("_", " ")
    if "MIG" in name.split():  # e.g. 'NVIDIA H100 80GB HBM3 MIG 1g.10gb': a fraction
        return None
    for pattern, peak in ROWS:
        if re.search(pattern, name):
            return peak
    return None


def unknown_reason(device_name: str) -> str:
    """Why there is no MFU for this device, in one line (for reports)."""
    if "MIG" in device_name.upper().replace("-", " ").split():
        return f"{device_name} is a MIG slice (a fraction of the GPU): no MFU"
    return (f"unknown device {device_name!r}: no MFU (no datasheet peak for it in "
            f"phalanx.runtime.peaks)")


def mfu(tokens_per_s: float, flops_per_token: float, device_name: str,
        n_devices: int = 1) -> float | None:
    """Model FLOPs utilisation: tokens/s · FLOPs per token over `n_devices` of this
    device's dense bf16 peak; None for a device with no row."""
    peak = peak_for(device_name)
    return None if peak is None else tokens_per_s * flops_per_token / (peak.bf16_flops *
                                                                       n_devices)
