"""`phalanx plan`'s tables (rich). Every table keeps its strategy labels whole at any
width (80 columns when piped): the label column never wraps or shrinks, headers are
short, what the columns mean goes in a caption below the table."""

from __future__ import annotations

from phalanx.plan.devices import GiB, human
from phalanx.plan.estimate import COMPONENTS, VARIANTS
from phalanx.plan.recommend import MICRO_BATCH_LIMIT

HEADERS = {"parameters": "params", "gradients": "grads", "optimizer": "optim",
           "activations": "activ.", "communication": "comm"}
MOMENTS = (("backward start", "bwd start"), ("optimizer step", "opt step"),
           ("forward, last block", "fwd last"), ("backward of ", "bwd "),
           ("forward of ", "fwd "), ("backward", "bwd"), ("block ", "blk "),
           ("micro-batch ", "mb "), (", in a blk", " in blk"), (", its last module", " end"),
           ("stage ", "s"))  # (a pipeline row's: "stage 0: backward of micro-batch 2, ...")
LABEL_WIDTH = max(len("strategy"), *(len(v.label) for v in VARIANTS))


def _unit(rows: list[dict]) -> tuple[str, int]:
    return ("GiB", GiB) if max(r["peak"] for r in rows) >= 4 * GiB else ("MiB", 2**20)


def _table(title: str, caption: str | None = None):
    """A table whose first column (the strategy) is added by the caller with `_label`."""
    from rich import box
    from rich.table import Table

    # one space between columns (no padding): ten columns fit in 80
    return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, caption_justify="left",
                 title_justify="left", padding=0, pad_edge=False)


def _label(table, labels) -> None:
    width = max([LABEL_WIDTH, *map(len, labels)])
    table.add_column("strategy", no_wrap=True, min_width=width)


def short_moment(moment: str) -> str:
    """`block 3 backward` → `blk 3 bwd`: the peak's moment in 9 characters or so."""
    for long, short in MOMENTS:
        moment = moment.replace(long, short)
    return moment


def console(file=None, width: int | None = None):
    from rich.console import Console

    return Console(file=file, width=width)


def print_plan(result: dict, out=None) -> None:
    out = out or console()
    unit, size = _unit(result["rows"])
    ac = "on" if result["activation_checkpointing"] else \
        ("off (Phalanx does not wrap --model; checkpointing your module does itself is "
         "traced)" if result["model"] != "MiniGPT" else "off")
    out.print(f"{result['world_size']} rank(s) on {result['device']} "
              f"({result['device_note']}), micro-batch {result['micro_batch']}, "
              f"{result['precision']}, activation checkpointing {ac}")
    table = _table(f"per-rank memory ({unit}) at each strategy's peak",
                   "params … comm: the bytes held at the peak moment (`at`), not each "
                   "term's own maximum over the step; peak = their sum; fits: within the "
                   "budget per rank; max mb: the largest micro-batch that fits.")
    _label(table, [r["strategy"] for r in result["rows"]])
    for column in (*(HEADERS[c] for c in COMPONENTS), "peak", "at", "fits", "max mb"):
        table.add_column(column, justify="left" if column == "at" else "right",
                         no_wrap=True)
    for r in result["rows"]:
        table.add_row(r["strategy"], *(f"{r[c] / size:.1f}" for c in COMPONENTS),
                      f"{r['peak'] / size:.1f}", short_moment(r["moment"]),
                      "yes" if r["fits"] else "NO",
                      _micro_batches(r["largest_micro_batch"]))
    out.print(table)
    n = result["parameters"]
    out.print(f"model: {result['model']}, "
              f"{f'{n / 1e6:.1f} M' if n >= 1e6 else f'{n:,}'} parameters, "
              f"vocabulary {result['vocab_size']:,} (--tokenizer "
              f"{result['tokenizer']}), optimizer {result['optimizer']}")
    if result.get("vocab_note"):
        out.print(f"note: {result['vocab_note']}")
    for note in result.get("user_notes", ()):
        out.print(f"your model: {note}")
    out.print(f"budget per rank: {human(result['budget_bytes'])}")
    if all("time" in r for r in result["rows"]):
        _print_time(out, result)
    else:
        out.print("step time: not predicted (no peak FLOP/s or bandwidth for this "
                  "device: give --gpu, or --peak-tflops and --busbw-gbs)")
    out.print(f"recommendation: {result['recommendation']}")


# what `optim ms` holds, by optimizer (`recommend._muon_flops`)
OPTIMIZER_TERM = {
    "muon": "optim = Newton–Schulz orthogonalisation of the hidden matrices at the same "
            "MFU (every matrix on each rank; ZeRO: its share)",
    "adamw": "optim = 0 (an elementwise update, not counted)"}


def _print_time(out, result: dict) -> None:
    table = _table(f"step time at MFU {result['mfu']:g}, {result['peak_flops'] / 1e12:g} "
                   f"TFLOP/s peak, bus bandwidth {result['busbw'] / 1e9:g} GB/s"
                   + (f" in a machine of {result['per_machine']} ranks, "
                      f"{result['inter_busbw'] / 1e9:g} GB/s between machines"
                      if result.get("inter_busbw") else ""),
                   "compute: forward and backward (a pipeline row's with its bubble); "
                   "optimizer "
                   f"{result['optimizer']}: {OPTIMIZER_TERM[result['optimizer']]}; comm "
                   "MB: sent per rank per optimizer step; exposed: the communication left "
                   "after it hides behind the pass it runs in (up to that pass's compute); "
                   "step = compute + optim + exposed.")
    _label(table, [r["strategy"] for r in result["rows"]])
    for column in ("compute ms", "optim ms", "comm MB", "comm ms", "exposed ms", "step ms"):
        table.add_column(column, justify="right", no_wrap=True)
    for r in result["rows"]:
        t = r["time"]
        table.add_row(r["strategy"], f"{t['compute_s'] * 1e3:.2f}",
                      f"{t['optimizer_s'] * 1e3:.2f}", f"{t['comm_bytes'] / 1e6:.1f}",
                      f"{t['comm_s'] * 1e3:.2f}", f"{t['exposed_s'] * 1e3:.2f}",
                      f"{t['step_s'] * 1e3:.2f}")
    out.print(table)


MEASURED = (("parameters", "params"), ("gradients", "grads"), ("optimizer", "optim"),
            ("activations", "activ."))


def print_measured(result: dict, out=None) -> None:
    out = out or console()
    table = _table("predicted ÷ measured per rank (torch's memory tracker, the worst rank)",
                   "params … activ.: the ratio at the measured peak (— : both under 5% of "
                   "the peak, too small to compare; ! : outside its band); peak MiB: predicted / measured; "
                   "activ. includes communication buffers (the tracker files them as "
                   "temporaries).")
    _label(table, result["measured"])
    for _, header in MEASURED:
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("peak MiB", justify="right", no_wrap=True)
    table.add_column("ratio", justify="right", no_wrap=True)
    table.add_column("step s", justify="right", no_wrap=True)
    for label, m in result["measured"].items():
        cells = [_ratio(m[name], m["peak"]["measured"]) for name, _ in MEASURED]
        peak = m["peak"]
        table.add_row(label, *cells, f"{peak['predicted'] / 2**20:.1f} / "
                                     f"{peak['measured'] / 2**20:.1f}",
                      _ratio(peak, None), f"{m['step_s']:.3f}")
    out.print(table)


def _ratio(cell: dict, peak: float | None) -> str:
    small = peak is not None and max(cell["predicted"], cell["measured"]) < 0.05 * peak
    if cell["ratio"] is None or small:
        return "—"
    return f"{cell['ratio']:.2f}" + ("" if cell.get("within", True) else " !")


def _micro_batches(n: int | None) -> str:
    """`max mb`: the search stops at 65,536 (then: that many or more fit)."""
    if n is None:
        return "—"
    return f"≥{n}" if n >= MICRO_BATCH_LIMIT else str(n)
