"""`phalanx plan`'s tables (rich)."""

from __future__ import annotations

from phalanx.plan.devices import GiB, human
from phalanx.plan.estimate import COMPONENTS

HEADERS = {"parameters": "params", "gradients": "grads", "optimizer": "optim",
           "activations": "activ.", "communication": "comm"}


def _unit(rows: list[dict]) -> tuple[str, int]:
    return ("GiB", GiB) if max(r["peak"] for r in rows) >= 4 * GiB else ("MiB", 2**20)


def print_plan(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    ac = "on" if result["activation_checkpointing"] else "off"
    unit, size = _unit(result["rows"])
    table = Table(title=f"per-rank memory ({unit}) at {result['world_size']} rank(s) on "
                        f"{result['device']} ({result['device_note']}), micro-batch "
                        f"{result['micro_batch']}, {result['precision']}, activation "
                        f"checkpointing {ac}")
    for column in ("strategy", *(HEADERS[c] for c in COMPONENTS), "peak", "at", "fits",
                   "max mb"):
        table.add_column(column, justify="left" if column in ("strategy", "at") else "right",
                         no_wrap=column != "strategy")
    for r in result["rows"]:
        at = r["moment"].replace("backward", "bwd").replace("optimizer", "optim")
        table.add_row(r["strategy"], *(f"{r[c] / size:.1f}" for c in COMPONENTS),
                      f"{r['peak'] / size:.1f}", at, "yes" if r["fits"] else "NO",
                      "—" if r["largest_micro_batch"] is None else
                      str(r["largest_micro_batch"]))
    console.print(table)
    console.print(f"budget per rank: {human(result['budget_bytes'])}")
    if all("time" in r for r in result["rows"]):
        _print_time(console, result)
    elif result["model"] != "MiniGPT":
        console.print("your model: activations traced on the meta device; step time and "
                      "the largest micro-batch are predicted for MiniGPT only")
    else:
        console.print("step time: not predicted (no peak FLOP/s or bandwidth for this "
                      "device: give --gpu, or --peak-tflops and --busbw-gbs)")
    console.print(f"recommendation: {result['recommendation']}")


def _print_time(console, result: dict) -> None:
    from rich.table import Table

    table = Table(title=f"step time at MFU {result['mfu']:g}, {result['peak_flops'] / 1e12:g} "
                        f"TFLOP/s peak, bus bandwidth {result['busbw'] / 1e9:g} GB/s "
                        f"(communication hides behind the pass it runs in, up to that "
                        f"pass's compute)")
    for column in ("strategy", "compute ms", "comm MB/step", "comm ms", "exposed ms",
                   "step ms"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for r in result["rows"]:
        t = r["time"]
        table.add_row(r["strategy"], f"{t['compute_s'] * 1e3:.2f}",
                      f"{t['comm_bytes'] / 1e6:.1f}", f"{t['comm_s'] * 1e3:.2f}",
                      f"{t['exposed_s'] * 1e3:.2f}", f"{t['step_s'] * 1e3:.2f}")
    console.print(table)


def print_measured(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="predicted / measured per rank (MiB; torch's memory tracker, the "
                        "worst rank)")
    names = ("parameters", "gradients", "optimizer", "activations", "peak")
    table.add_column("strategy")
    for n in names:
        table.add_column(n, justify="right")
    table.add_column("step s", justify="right")
    for label, m in result["measured"].items():
        cells = []
        for n in names:
            c = m[n]
            ratio = f" = {c['ratio']:.3f}" if c["ratio"] is not None else ""
            cells.append(f"{c['predicted'] / 2**20:.2f} / {c['measured'] / 2**20:.2f}{ratio}")
        table.add_row(label, *cells, f"{m['step_s']:.3f}")
    Console().print(table)
