"""A user's own loop on the public API (README's example): exact resume with no
bookkeeping (the loader's cursor and the fp16 scaler in `run.save`), at another world
size too, precision through the API, and `run.log`'s value on every rank."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.launch.agent import launch_workers

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import own_script_scenarios as sc  # noqa: E402


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("own")
    launch_workers([str(HERE / "own_script_scenarios.py"), str(out)], 2, threads=1)
    return out


def _load(path: Path):
    return torch.load(path, weights_only=False)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_resumed_loop_is_bit_identical_to_an_uninterrupted_one(out, precision):
    for rank in (0, 1):
        r = _load(out / f"resume-{precision}-rank{rank}.pt")
        for name, w in r["whole"].items():
            assert torch.equal(w, r["resumed"][name]), (precision, rank, name)
        assert r["resumed_losses"] == r["losses"][3:]  # steps 4..9, replayed exactly
        epochs, batches = divmod(sc.STEPS * sc.ACCUM, 5)  # 5 global batches an epoch, 4 left
        assert r["position"] == epochs * sc.SAMPLES + batches * sc.BATCH * 2
    if precision == "fp16":  # the scale fell and grew before the commit (step 3), so a
        scales = r["scales"][:4]  # resume that lost the scaler's state would differ
        assert any(b < a for a, b in zip(scales, scales[1:])), r["scales"]
        assert any(b > a for a, b in zip(scales, scales[1:])), r["scales"]
        assert scales[3] not in (2.0 ** 16, sc.SCALER["scale"]), r["scales"]  # at the commit
        assert r["scale"] == r["scales"][-1], (r["scale"], r["scales"])  # (resumed: same)


def test_two_ranks_checkpoint_resumes_at_one_rank_with_the_same_global_batch(out, capsys):
    whole = _load(out / "nodrop-rank0.pt")
    with phalanx.init(seed=4, threads=1, log_dir=out / "world1") as run:
        # issue 40.8: a resume on another world says so, and what it changes, in one line
        half = sc.fresh(run, dropout=0.0)  # the loader's batch as it was: half the global
        run.resume(out / "nodrop-half", *half[:2], loader=half[2])
        [said] = [x for x in capsys.readouterr().out.splitlines() if "resumed from" in x]
        assert said.endswith("(step 6); written by 2 rank(s) with ddp, now 1 with single; "
                             "changed: the global batch is 4 samples per micro-step instead "
                             "of 8 (2 → 1 ranks); to keep 8, give run.loader batch_size=8"), said
        parts = sc.fresh(run, batch=sc.BATCH * 2, dropout=0.0)
        step = run.resume(out / "nodrop-half", *parts[:2], loader=parts[2])
        assert step == 6
        assert "changed" not in capsys.readouterr().out  # the same global batch: no change
        sc.train(run, parts, out / "nodrop-half", sc.STEPS, save_every=100)
        got = sc.weights(run, parts[0])
    for name, w in whole.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=1e-5)


def test_log_returns_the_reduced_record_on_every_rank(out):
    for rank in (0, 1):
        r = _load(out / f"log-rank{rank}.pt")
        assert r["sum"] == {"step": 1, "value": 3.0}
        assert r["mean"] == {"step": 2, "value": 0.5}
