"""Sharded strategies (fsdp = FSDP2, zero = ZeRO-1) proven against DDP and one process,
with 2 and 3 gloo ranks on CPU (tests/dist/sharded_scenarios.py is the worker).

Tolerance: fp32, the same samples; sharded reduction (reduce-scatter, then each rank's
shard of the update) sums in another order than DDP's all-reduce, and accumulation
splits the batch differently. After 3 AdamW steps the largest weight difference seen is
~3e-6 (accumulation) and ~4e-7 (fsdp vs ddp); TOL allows 10x that.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.data.corpus import prepare
from phalanx.launch.agent import launch_workers
from phalanx.train.loop import train

sys.path.insert(0, str(Path(__file__).parent))
from sharded_scenarios import CLIP, MATRIX, VARIANTS, config, matrix_shape, using  # noqa: E402

TOL = dict(rtol=0, atol=3e-5)
SCRIPT = str(Path(__file__).parent / "sharded_scenarios.py")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, corpus_file, cache_dir):
    out = tmp_path_factory.mktemp("sharded")
    for what in ("equivalence", "matrix"):
        launch_workers([SCRIPT, str(out), str(corpus_file), str(cache_dir), what], 2, threads=1)
    return out


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def one_process(corpus_file, cache_dir, accum: int, optimizer: str = "adamw") -> dict:
    splits = prepare(str(corpus_file), str(cache_dir), 0.1)
    with phalanx.init(seed=7, threads=1) as run:
        result = train(config(8 // accum, accum, 3, strategy="single", optimizer=optimizer),
                       run, splits)
        return {"state": run.full_state_dict(result.model), "losses": result.losses,
                "norms": [float(n) for n in result.grad_norms]}


@pytest.mark.parametrize("accum", [1, 2])
def test_every_strategy_equals_ddp_and_one_process(sharded, corpus_file, cache_dir, accum):
    reference = one_process(corpus_file, cache_dir, accum)
    ddp = load(sharded / f"eq-ddp-k{accum}.pt")
    assert max_difference(ddp["state"], reference["state"]) < TOL["atol"]
    labels = [label for label in VARIANTS if not (label == "fsdp-last" and accum == 1)]
    for label in labels:
        found = load(sharded / f"eq-{label}-k{accum}.pt")
        for other in (ddp, reference):
            assert max_difference(found["state"], other["state"]) < TOL["atol"], label
            assert found["losses"] == pytest.approx(other["losses"], rel=1e-5), label
        # clipping was active every step, and the clipped norm is the same global number
        assert all(n > CLIP for n in found["norms"]), (label, found["norms"])
        assert found["norms"] == pytest.approx(ddp["norms"], rel=1e-5), label
        assert found["norms"] == pytest.approx(reference["norms"], rel=1e-5), label


@pytest.mark.parametrize("accum", [1, 2])
def test_muon_under_every_strategy_equals_ddp_and_one_process(sharded, corpus_file,
                                                               cache_dir, accum):
    """Muon orthogonalises whole matrices: zero keeps whole parameters per rank, fsdp
    gathers each update. Both equal ddp and one process (fp32, the reduction-order
    tolerance), and Muon really moved the hidden matrices differently from AdamW."""
    reference = one_process(corpus_file, cache_dir, accum, optimizer="muon")
    ddp = load(sharded / f"muon-ddp-k{accum}.pt")
    assert max_difference(ddp["state"], reference["state"]) < TOL["atol"]
    for label in MATRIX:
        found = load(sharded / f"muon-{label}-k{accum}.pt")
        assert max_difference(found["state"], reference["state"]) < TOL["atol"], label
        assert found["losses"] == pytest.approx(reference["losses"], rel=1e-5), label
    adam = load(sharded / f"eq-ddp-k{accum}.pt")
    assert max_difference(adam["state"], ddp["state"]) > 1e-3


@pytest.mark.parametrize("label", MATRIX)
def test_muon_resumes_bit_exactly(sharded, label):
    """The momentum buffers are checkpointed (sharded under fsdp, per owner under zero)."""
    straight = load(sharded / f"muon-straight-{label}.pt")
    resumed = load(sharded / f"muon-resumed-{label}.pt")
    for key, value in straight["state"].items():
        assert torch.equal(resumed["state"][key], value), (label, key)
    assert resumed["losses"] == straight["losses"][2:]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_with_every_strategy(sharded, precision):
    """fsdp gathers bf16/fp16 parameters (its mixed-precision policy, fp32 reduction) and
    steps through a sharded loss scaler for fp16; ddp/zero keep fp32 weights under
    autocast. Same low-precision matmuls: the losses agree to low-precision rounding."""
    ddp = load(sharded / f"mp-ddp-{precision}.pt")
    for label in ("fsdp", "zero"):
        found = load(sharded / f"mp-{label}-{precision}.pt")
        assert all(torch.isfinite(torch.tensor(found["losses"]))), label
        assert found["losses"] == pytest.approx(ddp["losses"], rel=2e-2), label
        assert found["losses"][-1] < found["losses"][0], label


def test_consistency_check_on_sharded_state(sharded):
    messages = [(sharded / f"sharded-guard-rank{r}.txt").read_text() for r in (0, 1)]
    assert messages[0] == messages[1]
    assert "`scale`" in messages[0] and "rank(s) 1" in messages[0], messages[0]


@pytest.mark.parametrize("first", MATRIX)
def test_resume_matrix_at_two_ranks(sharded, first):
    for then in MATRIX:
        resumed = load(sharded / f"resumed-{first}-{then}-w2.pt")
        straight = load(sharded / f"straight-{then}.pt")
        if first == then:  # the same strategy and world size: bit for bit
            for key, value in straight["state"].items():
                assert torch.equal(resumed["state"][key], value), (first, then, key)
            assert resumed["losses"] == straight["losses"][2:]
        else:
            assert max_difference(resumed["state"], straight["state"]) < TOL["atol"], then


def test_resume_matrix_at_three_ranks(sharded, corpus_file, cache_dir):
    launch_workers([SCRIPT, str(sharded), str(corpus_file), str(cache_dir), "resume"], 3,
                   threads=1)
    for first in MATRIX:
        for then in MATRIX:
            resumed = load(sharded / f"resumed-{first}-{then}-w3.pt")
            straight = load(sharded / f"straight-{then}.pt")
            assert max_difference(resumed["state"], straight["state"]) < TOL["atol"], \
                (first, then)


@pytest.mark.parametrize("first", MATRIX)
def test_resume_on_one_rank(sharded, corpus_file, cache_dir, tmp_path, first):
    splits = prepare(str(corpus_file), str(cache_dir), 0.1)
    micro, accum = matrix_shape(1)
    checkpoint = sharded / first / "checkpoints" / "step-00000002"
    straight = load(sharded / f"straight-{first}.pt")
    with phalanx.init(seed=7, threads=1) as run:
        for then in ("single", "fsdp"):  # fsdp over one rank: a DTensor layout of 1
            cfg = config(micro, accum, 4, tmp_path / then, str(checkpoint), strategy=then)
            with using(run, "fsdp") if then == "fsdp" else contextlib.nullcontext():
                result = train(cfg, run, splits, tmp_path / then)
                state = run.full_state_dict(result.model)
            assert max_difference(state, straight["state"]) < TOL["atol"], (first, then)
            assert result.state.step == 4


@pytest.mark.parametrize("first", ["fsdp", "zero"])
def test_export_of_a_sharded_checkpoint_loads_into_a_plain_minigpt(sharded, tmp_path, first):
    from phalanx.checkpoint.export import load_minigpt

    done = subprocess.run([sys.executable, "-m", "phalanx", "export", str(sharded / first),
                           "--out", str(tmp_path / "w.safetensors")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    model = load_minigpt(tmp_path, filename="w.safetensors")
    straight = load(sharded / f"straight-{first}.pt")["state"]
    for key, value in model.state_dict().items():
        assert torch.equal(value, straight[key]), key
