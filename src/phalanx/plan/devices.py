"""The devices `phalanx plan --gpu` knows: memory a program can use, dense bf16 peak, and
the all-reduce bus bandwidth ranks on one machine typically reach. Stated figures, not
measurements of your machine: `--peak-tflops`, `--busbw-gbs` or `--busbw-from` (the JSON
`phalanx doctor --json` writes) replace them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import UserError
from phalanx.paths import parse_json
from phalanx.runtime.peaks import ROWS

GiB = 2**30
RESERVED = 2 * GiB  # CUDA context and allocator slack kept free on a GPU


@dataclass(frozen=True)
class Device:
    name: str
    memory: int  # bytes a program sees
    peak_flops: float | None  # dense bf16 (GPUs); None: not stated (CPU)
    busbw: float | None  # bytes/s, all-reduce bus bandwidth within one machine
    note: str

    @property
    def usable(self) -> int:
        return self.memory - (RESERVED if self.peak_flops else 0)


def _peak(row: str) -> float:
    """The dense bf16 peak of `row` in phalanx.runtime.peaks (one table, cited there)."""
    return next(p.bf16_flops for _, p in ROWS if p.device == row)


GPUS = {
    "h100": Device("h100", int(79.1 * GiB), _peak("H100 SXM"), 360e9, "H100 SXM 80GB, NVLink 4"),
    "h200": Device("h200", int(139.8 * GiB), _peak("H200 SXM"), 360e9,
                   "H200 SXM 141GB, NVLink 4"),
    "a100-80g": Device("a100-80g", int(79.1 * GiB), _peak("A100"), 230e9,
                       "A100 SXM 80GB, NVLink 3"),
    "a100-40g": Device("a100-40g", int(39.4 * GiB), _peak("A100"), 230e9,
                       "A100 SXM 40GB, NVLink 3"),
    "l4": Device("l4", int(22.0 * GiB), _peak("L4"), 20e9, "L4 24GB, PCIe 4"),
}


def human(n: float) -> str:
    """`1.25 GiB`, or `37.5 MiB` under a GiB."""
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def host_memory() -> int:
    """This machine's RAM (MemTotal), for planning CPU ranks."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device(name: str | None) -> Device:
    """The `--gpu` entry, or this machine's CPU (its RAM shared by the ranks)."""
    if name is None:
        return Device("cpu", host_memory(), None, None, "this machine's RAM")
    key = name.lower()
    if key not in GPUS:
        raise UserError(f"unknown `--gpu {name}`; known: {', '.join(GPUS)}. Give "
                        f"`--peak-tflops` and `--busbw-gbs` with the closest one for "
                        f"another device.")
    return GPUS[key]


def busbw_from(path: str) -> float:
    """The largest all-reduce's bus bandwidth (bytes/s) in `phalanx doctor --json`'s
    output."""
    try:
        rows = parse_json(Path(path).read_text())["bandwidth"]
        best = max(rows, key=lambda r: r["bytes"])
        return float(best["busbw_gbs"]) * 1e9
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"`--busbw-from {path}`: not the JSON of `phalanx doctor --json` with "
                        f"a bandwidth sweep ({type(exc).__name__}: {exc}). Run `phalanx "
                        f"doctor --json > doctor.json` on the ranks you plan for.") from None
