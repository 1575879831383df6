"""Pipeline parallelism on 4 gloo ranks (tests/dist/pipeline_scenarios.py is the worker,
one launch for every case): MiniGPT cut into 2 stages, FSDP2 (pp 2 × dp_shard 2) or
tensor parallelism (pp 2 × tp 2) inside each, under torch's GPipe and 1F1B schedules,
each equal to one process training on the same global batch; and a pipeline's DCP
checkpoint loaded into the whole model.

Tolerance, derived here: plain FSDP (dp_shard 4) already differs from the one-process run
by float summation order; a pipeline layout may differ by at most 10 × that (floor 1e-6:
a missed stage's gradient, a wrong micro-batch scaling, a norm clipped per stage, moves
weights by 1e-3 or more after 3 steps — the test below plants one). SGD, not AdamW: AdamW
turns a gradient of 1e-10 (a relu² unit dead in one summation order, not in another) into
a step of the learning rate, so plain FSDP itself would differ by 3e-4.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from phalanx.config.layout import schedule_refusal, stage_blocks, stage_refusal
from phalanx.errors import UserError
from phalanx.launch.agent import launch_workers
from phalanx.strategies.pipeline import check_stages

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_scenarios import CASES, CLIP, LR, SCRIPTED, STEPS, batch, model  # noqa: E402

SCRIPT = str(Path(__file__).parent / "pipeline_scenarios.py")
PIPELINES = [name for name, (dims, *_) in CASES.items() if "pp" in dims]
SCRIPTS = [name for name, *_ in SCRIPTED]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    launch_workers([SCRIPT, str(out)], 4, threads=1)
    return out


def one_process(steps: int = STEPS, scale: float = 1.0):
    """The one-process run on the global batch (`scale`: the loss multiplied, to plant a
    wrong micro-batch scaling in the reference); its weights, losses, norms."""
    net, (x, y) = model(), batch()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    losses, norms = [], []
    for _ in range(steps):
        _, loss = net(x, y)
        (loss * scale).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP).item())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return net.state_dict(), losses, norms


@pytest.fixture(scope="module")
def reference():
    return one_process()


def stages(out: Path, case: str) -> tuple[dict, list, list]:
    """The case's whole weights (its stages' together), losses and norms (the last stage's)."""
    parts = [torch.load(p, weights_only=True) for p in sorted((out / case).glob("stage-*.pt"))]
    state = {k: v for part in parts for k, v in part["state"].items()}
    return state, parts[-1]["losses"], parts[-1]["norms"]


def farthest(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def bound(runs, reference):
    return max(10 * farthest(stages(runs, "dp4")[0], reference[0]), 1e-6)


@pytest.mark.parametrize("case", PIPELINES)
def test_a_pipeline_equals_one_process_on_the_global_batch(runs, reference, bound, case):
    state, losses, norms = stages(runs, case)
    assert farthest(state, reference[0]) <= bound, (case, farthest(state, reference[0]), bound)
    assert losses == pytest.approx(reference[1], rel=1e-4)
    assert norms == pytest.approx(reference[2], rel=1e-4)  # clipped over both stages


@pytest.mark.parametrize("case", SCRIPTS)
def test_a_scripts_loop_through_forward_backward_equals_one_process(runs, reference, bound,
                                                                     case):
    """The same loop under every layout (`run.setup`, `run.forward_backward`, clipping,
    `run.step`): pp 2 × dp_shard 2 (1F1B), pp 2 × tp 2 (GPipe), dp_shard 4 (accumulation),
    each the one-process run; `run.full_state_dict` gathers the stages on rank 0."""
    state, losses, norms = stages(runs, case)
    assert farthest(state, reference[0]) <= bound, (case, farthest(state, reference[0]))
    assert losses == pytest.approx(reference[1], rel=1e-4)
    assert norms == pytest.approx(reference[2], rel=1e-4)


def test_a_pipelines_checkpoint_resumes_under_another_layout(runs, reference, bound):
    """The pp 2 × dp_shard 2 script's checkpoint after step 2, resumed by the same script
    under dp_shard 4 (the optimizer's momentum included), ends its last step as one
    process does."""
    state, losses, _ = stages(runs, "resumed-dp4")
    assert farthest(state, reference[0]) <= bound
    assert losses == pytest.approx(reference[1][-1:], rel=1e-4)


def test_the_tolerance_would_catch_a_wrong_scaling(runs, reference, bound):
    """A reference whose loss is halved (what a gradient scaled by micro-batches twice
    gives) moves the weights far past the bound: the equality above can fail."""
    wrong = one_process(scale=0.5)[0]
    assert farthest(stages(runs, "pp-dp-1f1b")[0], wrong) > 100 * bound


def test_each_stage_holds_its_part_under_the_whole_models_names(runs):
    names = set(model().state_dict())
    first = torch.load(runs / "pp-dp-gpipe" / "stage-0.pt", weights_only=True)["state"]
    last = torch.load(runs / "pp-dp-gpipe" / "stage-1.pt", weights_only=True)["state"]
    assert not first.keys() & last.keys() and first.keys() | last.keys() == names
    assert "wte.weight" in first and "lm_head.weight" in last
    assert {k.split(".")[1] for k in first if k.startswith("blocks.")} == {"0", "1"}


@pytest.mark.parametrize("case", PIPELINES)
def test_a_pipelines_checkpoint_loads_into_the_whole_model(runs, case):
    """DCP reshards by name: the stages' sharded state, loaded into one whole MiniGPT,
    is the weights the stages hold, bit for bit."""
    whole = {"model": model().state_dict()}
    dcp.load(whole, checkpoint_id=str(runs / case / "dcp"))
    state = stages(runs, case)[0]
    assert all(torch.equal(whole["model"][k], state[k]) for k in state)


def test_stages_split_the_blocks_evenly_the_first_taking_the_rest():
    assert [list(stage_blocks(5, 2, s)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    assert [len(stage_blocks(8, 4, s)) for s in range(4)] == [2, 2, 2, 2]


@pytest.mark.parametrize("n_layer, tied, needle", [
    (1, False, "--n-layer 1 cannot fill 2 pipeline stages"),
    (4, True, "train with an untied head"),
])
def test_a_model_the_stages_cannot_take_is_one_line_first(n_layer, tied, needle):
    assert needle in stage_refusal(n_layer, 2, tied)
    net = model()
    net.config.n_layer, net.config.tie_embeddings = n_layer, tied
    with pytest.raises(UserError, match="--pp 2"):
        check_stages(net, 2)


@pytest.mark.parametrize("microbatches, schedule, needle", [
    (1, "1f1b", "pass microbatches=2 or more"),
    (4, "zb", "the schedule 'zb' is not one of gpipe, 1f1b"),
])
def test_what_the_schedules_would_refuse_is_said_before(microbatches, schedule, needle):
    assert needle in schedule_refusal(2, schedule, microbatches)
    assert schedule_refusal(2, "gpipe", 2) is None


def test_a_model_without_keep_stage_is_refused_naming_what_it_needs():
    with pytest.raises(UserError, match="needs a `keep_stage"):
        check_stages(torch.nn.Linear(2, 2), 2)
