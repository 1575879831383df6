"""The built-in trainer under pipeline stages on 4 gloo ranks
(tests/dist/pipeline_train_scenarios.py is the worker, one launch): pp 2 × dp_shard 2
(1F1B) and pp 2 × tp 2 (GPipe), each equal to one process training on the same global
batch, their validation loss (the schedule's forward-only pass) the non-pipelined one's,
and a pipeline's checkpoint resumed under dp_shard 4 with the data cursor exact.

Tolerance, derived here: the trainer under dp_shard 4 already differs from the
one-process run by float summation order; a pipeline may differ by at most 10 × that
(floor 1e-6). AdamW: a wrong micro-batch scaling or a stage left out of the clip moves the
weights by far more (the test below plants one).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.data.corpus import prepare
from phalanx.launch.agent import launch_workers
from phalanx.train.loop import train

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_train_scenarios import ACCUM, CASES, GLOBAL, STEPS, config  # noqa: E402

SCRIPT = str(Path(__file__).parent / "pipeline_train_scenarios.py")
PIPELINES = [name for name, (dims, _) in CASES.items() if "pp" in dims]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_file, cache_dir):
    out = tmp_path_factory.mktemp("pipeline-train")
    launch_workers([SCRIPT, str(out), str(corpus_file), str(cache_dir)], 4, threads=1)
    return {name: torch.load(out / f"{name}.pt", weights_only=True)
            for name in [*CASES, "resumed-dp4"]}


@pytest.fixture(scope="module")
def one(corpus_file, cache_dir):
    """One process, the same global batch in one micro-batch; and its loss scaled wrong
    (the clip's threshold halved: what clipping one stage's norm alone does)."""
    splits = prepare(str(corpus_file), str(cache_dir), 0.1)
    with phalanx.init(seed=7, threads=1) as run:
        result = train(config(GLOBAL, 1), run, splits)
        right = {"state": run.full_state_dict(result.model), "losses": result.losses,
                 "norms": [float(n) for n in result.grad_norms]}
        cfg = config(GLOBAL, 1)
        cfg.train.grad_clip /= 2
        wrong = run.full_state_dict(train(cfg, run, splits).model)
    return right, wrong


def farthest(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def bound(runs, one):
    return max(10 * farthest(runs["dp4"]["state"], one[0]["state"]), 1e-6)


@pytest.mark.parametrize("case", PIPELINES)
def test_the_trainer_under_pipeline_stages_equals_one_process(runs, one, bound, case):
    got, want = runs[case], one[0]
    assert farthest(got["state"], want["state"]) <= bound, \
        (case, farthest(got["state"], want["state"]), bound)
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-4)
    assert got["norms"] == pytest.approx(want["norms"], rel=1e-4)  # over both stages
    assert (got["step"], got["position"]) == (STEPS, STEPS * GLOBAL)


@pytest.mark.parametrize("case", PIPELINES)
def test_evaluation_through_the_schedule_equals_the_plain_one(runs, case):
    """Every case evaluates the same 4 validation sequences at step 3; the pipeline's
    forward-only pass gives dp_shard 4's validation loss."""
    assert list(runs[case]["val"]) == [STEPS]
    assert runs[case]["val"][STEPS] == pytest.approx(runs["dp4"]["val"][STEPS], rel=1e-5)


def test_a_pipelines_checkpoint_resumes_under_dp_shard_4(runs, one, bound):
    """pp 2 × dp_shard 2's step-2 checkpoint, resumed under dp_shard 4 (the optimizer's
    state and the data cursor included), ends step 3 as one process does."""
    got = runs["resumed-dp4"]
    assert farthest(got["state"], one[0]["state"]) <= bound
    assert got["losses"] == pytest.approx(one[0]["losses"][-1:], rel=1e-4)
    assert (got["step"], got["position"]) == (STEPS, STEPS * GLOBAL)


def test_the_tolerance_would_catch_a_wrong_clip(runs, one, bound):
    """A reference clipped at half the threshold is far outside the bound: the equality
    above can fail."""
    assert farthest(runs["pp-dp-1f1b"]["state"], one[1]) > 10 * bound
    assert ACCUM > 1  # (the window goes through the schedule as micro-batches)
