"""The resume-conformance matrix (issue 46; docs/conformance.md), through its own harness
(benchmarks/conformance/matrix.py): CI runs three of Phalanx's cells — killed mid-epoch,
killed mid-accumulation-window, resumed under another strategy — and checks the comparer
on fabricated records; PHALANX_FULL=1 runs the rest of Phalanx's column and every peer's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "conformance"))
from conformance_cells import assemble, compare, life_failure, resume_notes  # noqa: E402
from conformance_runner import RunResult  # noqa: E402
from conformance_scenarios import BY_NAME, LIBRARIES, SCENARIOS, Scenario, written  # noqa: E402
from matrix import markdown, run_cell  # noqa: E402

CI = ("mid-epoch", "accumulation", "strategy-change")
PEERS = [lib for lib in LIBRARIES if lib != "phalanx"]


def phalanx_conforms(scenario: Scenario, cell: str) -> bool:
    """Phalanx's expected cell: exact; where the reduction order may change (another world
    size or strategy), the same samples with weights within the tolerance; n/a on CPU for
    the CUDA-only scenario."""
    if scenario.cuda_only:
        return cell == scenario.cuda_only
    if scenario.tolerant and cell.startswith("same samples, weights within "):
        return True
    return cell == "exact"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """Where the cells run, and the reference runs they share (mid-epoch's serves
    strategy-change)."""
    return tmp_path_factory.mktemp("conformance"), {}


@pytest.mark.parametrize("name", [
    *CI, *(pytest.param(s.name, marks=pytest.mark.full) for s in SCENARIOS
           if s.name not in CI)])
def test_phalanx_resumes_as_if_never_stopped(name, matrix):
    out, cache = matrix
    cell = run_cell(BY_NAME[name], "phalanx", out, cache)
    assert phalanx_conforms(BY_NAME[name], cell["cell"]), json.dumps(cell, indent=1)


@pytest.mark.full
@pytest.mark.parametrize("library", PEERS)
@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_peer_cell_is_decided(name, library, matrix):
    """A peer's cell is whatever its library does; its script must at least train the
    task uninterrupted (its reference run), else the cell says nothing about the library."""
    if not written(library):
        pytest.skip(f"{LIBRARIES[library]} is not written")
    out, cache = matrix
    cell = run_cell(BY_NAME[name], library, out, cache)
    assert "(the reference run)" not in cell["cell"] or cell["cell"].startswith("refused"), \
        json.dumps(cell, indent=1)


# -- the comparer, on fabricated records ----------------------------------------------------
def _records(steps: dict[int, tuple[list[int], list[int]]], life: int = 0,
             loss: float = 0.5) -> list[dict]:
    return [{"life": life, "step": s, "rank": r, "samples": samples[r], "loss": loss}
            for s, samples in steps.items() for r in (0, 1)]


REF = {1: ([0, 1], [2, 3]), 2: ([4, 5], [6, 7]), 3: ([8, 9], [10, 11])}


@pytest.fixture
def weights(tmp_path):
    def write(name: str, shift: float = 0.0) -> Path:
        path = tmp_path / f"{name}.pt"
        torch.save({"w": torch.ones(3) + shift}, path)
        return path
    return write


def test_the_same_record_and_weights_are_exact(weights):
    ref = assemble(_records(REF))
    assert compare(ref, assemble(_records(REF)), weights("a"), weights("b"), False) == "exact"


def test_one_swapped_sample_is_a_difference_in_samples(weights):
    swapped = {**REF, 2: ([4, 5], [6, 8]), 3: ([7, 9], [10, 11])}
    got = compare(assemble(_records(REF)), assemble(_records(swapped)), weights("a"),
                  weights("b"), tolerant=True)
    assert got == "differs: first at step 2 (samples)"


def test_a_missing_step_is_a_difference_in_samples(weights):
    shorter = {s: v for s, v in REF.items() if s != 3}
    got = compare(assemble(_records(REF)), assemble(_records(shorter)), weights("a"),
                  weights("b"), False)
    assert got == "differs: first at step 3 (samples)"


def test_a_loss_or_weights_off_by_a_little(weights):
    ref = assemble(_records(REF))
    lossy = assemble(_records(REF, loss=0.5 + 1e-9))
    assert compare(ref, lossy, weights("a"), weights("b"), False) == \
        "differs: first at step 1 (loss)"
    moved = weights("c", 2.0 ** -20)  # (exact in float32: 9.5e-07)
    assert compare(ref, lossy, weights("a"), moved, True) == \
        "same samples, weights within 9.5e-07"
    assert compare(ref, assemble(_records(REF)), weights("a"), moved, False) == \
        "differs: first at step 3 (weights: max abs 9.5e-07)"
    assert compare(ref, assemble(_records(REF)), weights("a"), weights("d", 0.1), True) \
        .startswith("differs: first at step 3 (weights")


def test_the_latest_life_that_recorded_a_step_wins():
    killed = _records({1: REF[1], 2: ([0, 0], [0, 0])}, life=0)
    resumed = _records({2: REF[2], 3: REF[3]}, life=1)
    steps = assemble(killed + resumed)
    assert steps[2].samples == [4, 5, 6, 7] and steps[2].life == 1 and steps[1].life == 0


def test_a_resumed_life_that_starts_over_or_elsewhere_is_said():
    mid = BY_NAME["mid-epoch"]  # checkpoint every 4, killed after 6: resumes at 5
    ref = assemble(_records(REF))
    over = _records({s: REF[1] for s in range(1, 7)}) + _records({1: REF[1]}, life=1)
    assert resume_notes(mid, over, ref)[0].startswith("no checkpoint")
    late = _records({s: REF[1] for s in range(1, 7)}) + _records({7: REF[1]}, life=1)
    assert resume_notes(mid, late, ref) == (None, ["life 1 began at step 7, not 5"])


def test_refusals_and_kills_are_told_apart(tmp_path):
    def result(rc, stderr: str) -> RunResult:
        (tmp_path / "err").write_text(stderr)
        (tmp_path / "out").write_text("")
        return RunResult("life-0", [], rc, 1.0, str(tmp_path / "out"), str(tmp_path / "err"))

    killed = _records({s: REF[1] for s in range(1, 7)})
    final = tmp_path / "final.pt"
    assert life_failure(result(1, "refused: no fsdp\n"), [], 0, 6, final) == \
        "refused: no fsdp"
    assert life_failure(result(1, "x\nRuntimeError: boom\n====\n"), killed[:4], 0, 6,
                        final) == "crashed: RuntimeError: boom"
    assert life_failure(result(-9, ""), killed, 0, 6, final) is None
    assert life_failure(result(0, ""), killed, 0, 0, final).startswith("crashed")


def test_the_table_says_what_was_not_run():
    table = markdown({"cells": {"mid-epoch": {"phalanx": {"cell": "exact"}}}}, ["phalanx"])
    assert "| mid-epoch: checkpoint every 4, kill after 6 | exact |" in table
    assert "| fp16 loss scale | n/a on CPU (CUDA tier) |" in table
    assert "not run yet" in table
