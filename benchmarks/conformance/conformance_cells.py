"""How a cell of the conformance matrix is decided, from the records (common.Trace) and the
final weights of a reference run and of a resumed run (docs/conformance.md).

A step's record, assembled over ranks: the multiset of global sample indices (sorted) and
the mean of the ranks' losses. The resumed run's record of a step is that of the latest
life that recorded the step (a killed life may have recorded steps the next one redid).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

WEIGHT_TOL = 1e-4  # the most a changed reduction order may move a weight (tolerant cells)
LOSS_TOL = 1e-5  # ... and a step's mean loss (relative, and absolute near 0)


@dataclass
class Step:
    life: int
    samples: list[int]  # every rank's, sorted
    loss: float  # the mean of the ranks' losses


def read_records(run_dir: Path) -> list[dict]:
    """Every line of every rank's trace (a torn last line of a killed rank is skipped)."""
    records = []
    for path in sorted(Path(run_dir).glob("trace-rank*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def assemble(records: list[dict]) -> dict[int, Step]:
    """step -> its record, from the latest life that recorded it (all its ranks)."""
    latest: dict[int, int] = {}
    for r in records:
        latest[r["step"]] = max(latest.get(r["step"], -1), r["life"])
    chosen: dict[int, list[dict]] = {}
    for r in records:
        if r["life"] == latest[r["step"]]:
            chosen.setdefault(r["step"], []).append(r)
    steps = {}
    for step, rows in chosen.items():
        rows.sort(key=lambda r: r["rank"])
        samples = sorted(i for r in rows for i in r["samples"])
        steps[step] = Step(rows[0]["life"], samples, sum(r["loss"] for r in rows) / len(rows))
    return steps


def life_steps(records: list[dict], life: int) -> list[int]:
    return sorted({r["step"] for r in records if r["life"] == life})


def weights_gap(a: Path, b: Path) -> tuple[bool, float] | None:
    """(bitwise equal, max abs difference) of two final.pt files; None if they do not hold
    the same tensors."""
    x = torch.load(a, map_location="cpu", weights_only=True)
    y = torch.load(b, map_location="cpu", weights_only=True)
    if x.keys() != y.keys() or any(x[k].shape != y[k].shape for k in x):
        return None
    equal = all(torch.equal(x[k], y[k]) for k in x)
    gap = max((float((x[k].double() - y[k].double()).abs().max()) for k in x if x[k].numel()),
              default=0.0)
    return equal, gap


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= LOSS_TOL * max(1.0, abs(a), abs(b))


def first_difference(ref: dict[int, Step], got: dict[int, Step], tolerant: bool
                     ) -> tuple[int, str] | None:
    """The first step whose samples (or, in order, loss) differ, as (step, what); a step
    one side lacks counts as differing samples. Losses: bitwise, or within LOSS_TOL when
    `tolerant`."""
    for step in sorted(set(ref) | set(got)):
        if step not in ref or step not in got or ref[step].samples != got[step].samples:
            return step, "samples"
    for step in sorted(ref):
        a, b = ref[step].loss, got[step].loss
        if a != b and not (tolerant and _close(a, b)):
            return step, "loss"
    return None


def compare(ref: dict[int, Step], got: dict[int, Step], ref_final: Path, got_final: Path,
            tolerant: bool) -> str:
    """The cell for a resumed run that ran to its end, against its reference."""
    if not ref:
        return "crashed: the reference run recorded no step"
    strict = first_difference(ref, got, tolerant=False)
    if strict is not None and strict[1] == "samples":
        return f"differs: first at step {strict[0]} (samples)"
    gap = weights_gap(ref_final, got_final)
    if gap is None:
        return "differs: final weights (other tensors than the reference's)"
    equal, most = gap
    if strict is None and equal:
        return "exact"
    loose = first_difference(ref, got, tolerant)
    if loose is not None:
        return f"differs: first at step {loose[0]} (loss)"
    if tolerant and most <= WEIGHT_TOL:
        return f"same samples, weights within {most:.1e}"
    return f"differs: first at step {max(ref)} (weights: max abs {most:.1e})"


def life_failure(result, records: list[dict], life: int, kill_after: int,
                 final: Path) -> str | None:
    """Why a run (a life, or the reference: life -1) is not what was asked — a refusal, a
    timeout, a crash, a kill that did not happen — or None. `result`: conformance_runner.RunResult."""
    refusal = result.refusal()
    if refusal is not None:
        return f"refused: {refusal}"
    if result.rc is None:
        return f"crashed: timed out ({result.name})"
    if kill_after:
        done = life_steps(records, life)
        if done and done[-1] >= kill_after and result.rc != 0:
            return None  # killed where asked
        if result.rc == 0:
            return f"crashed: {result.name} was not killed after step {kill_after}"
        return f"crashed: {result.last_line()}"
    if result.rc != 0 or not final.is_file():
        return f"crashed: {result.last_line()}"
    return None


def resume_notes(scenario, records: list[dict], ref: dict[int, Step]
                 ) -> tuple[str | None, list[str]]:
    """(a cell that ends the judgement, e.g. "no checkpoint"; notes for the cell): each
    resumed life should begin at its checkpoint's step + 1."""
    notes = []
    for life in range(1, len(scenario.lives)):
        steps = life_steps(records, life)
        expected = scenario.expected_checkpoint(life)
        if not steps:
            return f"crashed: life {life} recorded no step", notes
        if steps[0] == 1 and expected > 0:
            return f"no checkpoint (life {life} started over at step 1)", notes
        if steps[0] != expected + 1:
            notes.append(f"life {life} began at step {steps[0]}, not {expected + 1}")
    return None, notes
