"""`phalanx plan --model-states`: the model states one rank holds (parameters, gradients,
optimizer state; no activations, no buffers in flight), for any parameter count Ψ and
N data-parallel ranks — the ZeRO paper's table beside Phalanx's strategies.

ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models", Figure 1) trains in mixed precision with Adam: 2-byte parameters and
gradients, and K = 12 bytes of optimizer state per parameter (an fp32 master copy,
momentum and variance, 4 each). Its stages, per rank:

    baseline (data parallel)    (2 + 2 + K)·Ψ
    P_os   (optimizer state)    2Ψ + 2Ψ + K·Ψ/N
    P_os+g (and gradients)      2Ψ + (2 + K)·Ψ/N
    P_os+g+p (and parameters)   (2 + 2 + K)·Ψ/N

(Ψ = 7.5 B, N = 64: 120 / 31.4 / 16.6 / 1.9 GB.)

Phalanx keeps fp32 parameters under autocast (bf16/fp16 copies are made per op, and count
as activations), so its model states are 4-byte throughout — `plan.estimate` at the
optimizer step, without the root FSDP keeps gathered or ZeRO's whole-parameter imbalance:

    ddp    4Ψ params + 4Ψ grads + 8Ψ AdamW (exp_avg, exp_avg_sq)  = 16Ψ
    zero   4Ψ + 4Ψ + 8Ψ/N   (torch's ZeroRedundancyOptimizer shards the optimizer state
                             only: the paper's P_os, with fp32 parameters and no master
                             copy — not its 4Ψ + 12Ψ/N)
    fsdp   (4 + 4 + 8)·Ψ/N  (FSDP2 shards fp32 parameters, gradients and state: P_os+g+p)

With `--optimizer muon` the share m of parameters Muon steps (the hidden matrices) keeps 1
state copy (its momentum) and the rest AdamW's 2: optimizer state 4·(2 − m)·Ψ instead of
8Ψ (m = 1 when only a parameter count is given).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

GB = 1e9  # the paper's unit
PAPER_K = 12  # mixed-precision Adam: fp32 parameters, momentum, variance
SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


@dataclass(frozen=True)
class StateRow:
    regime: str
    formula: str
    bytes_per_rank: float


def paper_rows(params: float, W: int, K: int = PAPER_K) -> list[StateRow]:
    """The ZeRO paper's four stages (module doc), bytes per rank."""
    P = params
    return [StateRow("baseline (DDP)", "(2+2+K)Ψ", (2 + 2 + K) * P),
            StateRow("P_os", "2Ψ+2Ψ+KΨ/N", 4 * P + K * P / W),
            StateRow("P_os+g", "2Ψ+(2+K)Ψ/N", 2 * P + (2 + K) * P / W),
            StateRow("P_os+g+p", "(2+2+K)Ψ/N", (2 + 2 + K) * P / W)]


def optimizer_bytes_per_param(optimizer: str = "adamw", muon_share: float = 1.0) -> float:
    """fp32 optimizer state per parameter: AdamW 2 copies, 8 bytes; Muon 1 copy (4 bytes)
    for its share m and AdamW's 8 for the rest, 4·(2 − m)."""
    if optimizer == "adamw":
        return 8.0
    if optimizer == "muon":
        if not 0 <= muon_share <= 1:
            raise ValueError(f"muon_share must be in [0, 1], got {muon_share}")
        return 4 * (2 - muon_share)
    raise ValueError(f"unknown optimizer {optimizer!r}: adamw or muon")


def phalanx_rows(params: float, W: int, optimizer: str = "adamw",
                 muon_share: float = 1.0) -> list[StateRow]:
    """Phalanx's strategies (module doc): fp32 parameters and gradients, optimizer state
    k bytes per parameter (`optimizer_bytes_per_param`: 8 for AdamW)."""
    P, k = params, optimizer_bytes_per_param(optimizer, muon_share)
    return [StateRow("ddp", f"4Ψ+4Ψ+{k:.3g}Ψ", (8 + k) * P),
            StateRow("zero", f"4Ψ+4Ψ+{k:.3g}Ψ/N", 8 * P + k * P / W),
            StateRow("fsdp", f"(4+4+{k:.3g})Ψ/N", (8 + k) * P / W)]


def parse_count(text: str) -> float:
    """`7.5e9`, `7.5B`, `124M`, `350k` → a parameter count (argparse's type)."""
    t = text.strip().lower().replace("_", "").replace(",", "")
    scale = SUFFIXES.get(t[-1:], 1.0)
    try:
        value = float(t[:-1] if t[-1:] in SUFFIXES else t) * scale
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive parameter count such as "
                                         f"7.5e9, 7.5B or 124M, got {text!r}")
    return value


def table(params: float, W: int, optimizer: str = "adamw", muon_share: float = 1.0
          ) -> dict:
    """The rows `--model-states` prints (and `--json` writes): the paper's, Phalanx's with
    AdamW (the paper's optimizer: the rows to compare), and with `optimizer` muon also
    Phalanx's with Muon."""
    rows = [("ZeRO paper", r) for r in paper_rows(params, W)]
    rows += [("Phalanx, AdamW", r) for r in phalanx_rows(params, W)]
    if optimizer == "muon":
        rows += [("Phalanx, Muon", r) for r in phalanx_rows(params, W, optimizer, muon_share)]
    return {"parameters": params, "world_size": W, "optimizer": optimizer,
            "muon_share": muon_share if optimizer == "muon" else None,
            "rows": [{"source": source, "regime": r.regime, "formula": r.formula,
                      "bytes_per_rank": r.bytes_per_rank} for source, r in rows]}


def print_table(result: dict, out=None) -> None:
    """The paper's four rows, then Phalanx's, in GB (1e9 bytes) per rank: two tables."""
    from rich.console import Console

    out = out or Console()
    n, W = result["parameters"], result["world_size"]
    count = f"{n / 1e9:.4g} B" if n >= 1e9 else f"{n / 1e6:.4g} M"
    out.print(f"model states per rank (parameters, gradients, optimizer state; no "
              f"activations or gathered buffers): Ψ = {count} parameters, N = {W} "
              f"rank(s), GB = 1e9 bytes")
    for source in dict.fromkeys(r["source"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["source"] == source]
        out.print()
        out.print(_heading(source, result["muon_share"]))
        out.print(_table(rows))


def _table(rows: list[dict]):
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("regime", no_wrap=True, min_width=14)
    t.add_column("formula", no_wrap=True)
    t.add_column("GB/rank", justify="right", no_wrap=True)
    for r in rows:
        gb = r["bytes_per_rank"] / GB  # the paper's rounding; 3 figures under 1 GB
        t.add_row(r["regime"], r["formula"], f"{gb:,.1f}" if gb >= 1 else f"{gb:.3g}")
    return t


def _heading(source: str, share: float | None) -> str:
    if source == "ZeRO paper":
        return "ZeRO paper (Figure 1): 2-byte parameters and gradients, Adam's K = 12"
    if source == "Phalanx, Muon":
        return (f"Phalanx with Muon (--optimizer muon): fp32 parameters under autocast, "
                f"Muon's 1 state copy on {share:.0%} of them (AdamW's 2 on the rest)")
    return ("Phalanx with AdamW (the paper's optimizer): fp32 parameters under autocast, "
            "AdamW's 2 state copies — zero keeps 8Ψ + 8Ψ/N, not the paper's 4Ψ + 12Ψ/N")
