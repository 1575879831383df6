"""`phalanx plan`'s tables keep every strategy's label on its row at 80 columns (what
`phalanx plan | cat` gets), and say what the columns mean."""

from __future__ import annotations

import io

from rich.console import Console

from phalanx.config.sections import build_config
from phalanx.plan.devices import device
from phalanx.plan.estimate import VARIANTS
from phalanx.plan.recommend import plan, recommend
from phalanx.plan.tables import print_measured, print_plan, short_moment

LABELS = [v.label for v in VARIANTS]


def render(fn, result: dict, width: int = 80) -> list[str]:
    buf = io.StringIO()
    fn(result, Console(file=buf, width=width))
    lines = buf.getvalue().splitlines()
    assert all(len(line.rstrip()) <= width for line in lines)
    return lines


def rows_of(lines: list[str], after: str) -> dict[str, str]:
    """The table under the line holding `after`: each label's row."""
    start = next(i for i, line in enumerate(lines) if after in line)
    found = {}
    for line in lines[start:]:
        for label in sorted(LABELS, key=len, reverse=True):
            if line.strip().startswith(label + " ") and label not in found:
                found[label] = line
                break
        if len(found) == len(LABELS):
            break
    return found


def test_plan_and_time_tables_keep_their_labels_at_80_columns():
    cfg = build_config({"model": {"preset": "gpt2-124m"}})
    result = plan(cfg, 8, device("a100-40g"), 0.4, 312e12, 230e9)
    lines = render(print_plan, result)
    memory = rows_of(lines, "per-rank memory")
    assert set(memory) == set(LABELS)
    for r in result["rows"]:  # the row holds its own numbers, whole
        row = memory[r["strategy"]]
        assert f"{r['peak'] / 2**30:.1f}" in row and short_moment(r["moment"]) in row
    time = rows_of(lines, "step time at MFU")
    assert set(time) == set(LABELS)
    for r in result["rows"]:
        assert time[r["strategy"]].rstrip().endswith(f"{r['time']['step_s'] * 1e3:.2f}")
    text = " ".join(lines)
    assert "bytes held at the peak moment" in text and "step = compute + optim + exposed" in text


def test_measured_table_keeps_its_labels_at_80_columns():
    cell = {"predicted": 3 * 2**20, "measured": 3 * 2**20, "ratio": 1.0, "within": True}
    off = {"predicted": 2 * 2**20, "measured": 4 * 2**20, "ratio": 0.5, "within": False}
    measured = {label: {"parameters": cell, "gradients": cell, "optimizer": cell,
                        "activations": off, "peak": cell, "step_s": 0.123, "rank": 0}
                for label in LABELS}
    lines = render(print_measured, {"measured": measured})
    rows = rows_of(lines, "predicted ÷ measured")
    assert set(rows) == set(LABELS)
    for row in rows.values():
        assert "0.50 !" in row and "3.0 / 3.0" in row and row.rstrip().endswith("0.123")


def test_short_moments():
    assert short_moment("backward start") == "bwd start"
    assert short_moment("block 11 backward") == "blk 11 bwd"
    assert short_moment("forward, last block") == "fwd last"
    assert short_moment("optimizer step") == "opt step"


def test_a_recommendation_that_breaks_a_tie_says_so():
    """Steps equal to 0.1 ms: the least communication decides, and the sentence says it;
    a clear winner says nothing of ties."""
    def row(label, step_s, comm, peak=2**30):
        return {"strategy": label, "fits": True, "peak": peak, "largest_micro_batch": 8,
                "time": {"step_s": step_s, "comm_bytes": comm}}

    tied = recommend([row("ddp", 0.10001, 9e6), row("zero", 0.10002, 5e6),
                      row("fsdp", 0.2, 1e6)], 2**33)
    assert tied.startswith("zero: ") and "tied with ddp" in tied and \
        "less communication" in tied, tied
    clear = recommend([row("ddp", 0.1, 9e6), row("zero", 0.2, 5e6)], 2**33)
    assert clear.startswith("ddp: ") and "tie" not in clear, clear
