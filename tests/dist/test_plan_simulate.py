"""`phalanx plan --simulate`: one rank of an N-rank job run in this process (torch's fake
process group, fake tensors for fsdp), against `--measure` on real gloo ranks at N = 2
and 3, against the formulas at N = 64 and 1,024 (agreement: no line of difference; shapes
known to differ named in KNOWN), and the one line a failure gives."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
import torch.distributed as dist

import phalanx.models as models
from phalanx.config.sections import build_config
from phalanx.errors import UserError
from phalanx.plan import formulas as f
from phalanx.plan.devices import device
from phalanx.plan.estimate import VARIANTS, mesh_variant
from phalanx.plan.recommend import facts_for, plan
from phalanx.plan.simulate import add_simulate_arguments, run_simulate, simulate
from phalanx.plan.simulate_report import NAMES, compare_all

SHAPE = {"model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},
         "train": {"micro_batch_size": 4}}


def small(**train) -> object:
    return build_config({**SHAPE, "train": {**SHAPE["train"], **train}})


def predicted(cfg, W: int) -> tuple[dict, dict]:
    result = plan(cfg, W, device(None), 0.4, None, None)
    return result, {r["strategy"]: r for r in result["rows"]}


@pytest.fixture(autouse=True)
def no_group_left():
    yield
    assert not dist.is_initialized(), "the simulation left a process group initialised"


@pytest.mark.solo
@pytest.mark.parametrize("W", [2, 3])
def test_simulated_equals_measured_on_real_gloo_ranks(W):
    from phalanx.plan.compare import measure_locally

    cfg = small()
    _, rows = predicted(cfg, W)
    measured = measure_locally(cfg, W, 1, list(rows.values()))
    found = simulate(cfg, W)
    for label, m in measured.items():
        sim = found["variants"][label]
        assert "failed" not in sim and "skipped" not in sim, sim
        for name in NAMES:
            got, want = sim[name], m[name]["measured"]
            assert abs(got - want) <= 0.05 * max(got, want), (label, name, got, want)


FLAGS = ["--n-layer", "2", "--n-head", "2", "--n-embd", "64", "--block-size", "64",
         "--micro-batch-size", "4"]  # SHAPE, as the CLI takes it


@pytest.mark.parametrize("W,layout", [(64, ()), (1024, ()),
                                      (64, ("--dp-replicate", "2", "--dp-shard", "32"))],
                         ids=["64", "1024", "64-hsdp"])
def test_simulation_agrees_with_the_formulas(W, layout, capsys):
    """`phalanx plan … --world-size W --simulate --json`: every variant simulated, each
    component and the communication within 10 % of the formulas, and no line of
    difference (`why` empty) — at 1,024 ranks as at 64; with an HSDP layout, its row
    too."""
    from phalanx.cli.dispatch import main

    assert main(["plan", *FLAGS, "--world-size", str(W), *layout, "--simulate",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["simulated"]
    hsdp_row = {"hsdp (2 × 32)"} if layout else set()
    assert set(result["variants"]) == {v.label for v in VARIANTS} | hsdp_row, result
    for label, v in result["variants"].items():
        assert "components" in v, (label, v)  # neither failed nor skipped
        off = {n: c for n, c in v["components"].items() if not c["within"]}
        assert not off and v["comm"]["within"] and v["why"] == [], \
            (label, off, v["comm"], v["why"])
    if W == 64:  # DCP writes this rank's shards (HSDP: R copies in the local plan)
        for label in ("fsdp", *hsdp_row):
            ck = result["variants"][label]["checkpoint"]
            assert abs(ck["simulated"] / ck["copies"] / ck["even_share"] - 1) < 0.05, ck
    else:  # FSDP pads 64-row tensors to 1,024 rows, and the plan counts them padded
        assert _gathered(small(), W) > 2 * _gathered(small(), 1)  # (more than doubled)


def test_hsdp_at_1024_ranks_agrees_with_the_formulas():
    """One rank of 8 replica groups of 128 (issue 44): memory as fsdp over 128 ranks, the
    communication fsdp's over the group plus the gradient shards' all-reduce across the 8
    groups (recorded by the simulation, sized by the formulas) — no line of difference.
    (One micro-step: the simulation's memory tracker refuses a module called twice in a
    step, so --grad-accum > 1 is not simulated; test_plan_hsdp checks its formula.)"""
    v = mesh_variant(8, 128)
    cfg = small()
    result = plan(cfg, 1024, device(None), 0.4, None, None, extra=(v,))
    rows = {r["strategy"]: r for r in result["rows"]}
    found = compare_all(cfg, simulate(cfg, 1024, variants=(v,), predicted=rows), rows)
    got = found["variants"][v.label]
    assert "components" in got, got
    off = {n: c for n, c in got["components"].items() if not c["within"]}
    assert not off and got["comm"]["within"] and got["why"] == [], (off, got["comm"])
    # the replica groups' all-reduce alone (a small part of the whole): its bytes as the
    # formula sizes it, 2·(R−1)/R of a rank's gradient shard
    facts = facts_for(cfg, variant=v)
    shard = f.gathered_bytes(facts.param_shapes, 128, facts.reduced) // 128
    ratio = got["comm"]["by_op"]["allreduce_"] / f.ring_all_reduce_bytes(shard, 8)
    assert 1 <= ratio < 1.01, ratio  # (the gradient norm's few bytes on top)


def test_an_hsdp_layout_with_an_fsdp_option_simulates(capsys):
    """The layout flags chose fsdp, so fsdp's options stay valid when each simulated
    variant's config is checked again; the hsdp row keeps --no-fsdp-reshard-after-forward."""
    from phalanx.cli.dispatch import main

    assert main(["plan", *FLAGS, "--world-size", "8", "--dp-replicate", "2", "--dp-shard",
                 "4", "--no-fsdp-reshard-after-forward", "--simulate", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["simulated"]["variants"]
    got = result["hsdp (2 × 4, no reshard)"]
    assert "components" in got and got["comm"]["within"] and got["why"] == [], got


# shapes known to differ from the formulas, each named with the one line that says why
KNOWN = {"zero-rank-owning-no-parameter": (1024, 1023, VARIANTS[1], ["optimizer"],
                                           "ZeroRedundancyOptimizer gives whole parameters")}


@pytest.mark.parametrize("case", sorted(KNOWN))
def test_a_shape_known_to_differ_says_why(case):
    W, rank, variant, differs, words = KNOWN[case]
    cfg = small()
    _, rows = predicted(cfg, W)
    found = simulate(cfg, W, variants=(variant,), rank=rank, predicted=rows)
    v = compare_all(cfg, found, rows)["variants"][variant.label]
    assert [n for n, c in v["components"].items() if not c["within"]] == differs, v
    assert len(v["why"]) == 1 and words in v["why"][0], v["why"]


def _gathered(cfg, W: int) -> int:
    from phalanx.plan import formulas
    from phalanx.plan.recommend import facts_for

    return formulas.gathered_bytes(facts_for(cfg, variant=VARIANTS[2]).param_shapes, W)


def test_bf16_fsdp_communication_is_counted_in_its_dtypes():
    cfg = small(precision="bf16")
    _, rows = predicted(cfg, 8)
    result = compare_all(cfg, simulate(cfg, 8, variants=(VARIANTS[2],), predicted=rows),
                         rows)
    fsdp = result["variants"]["fsdp"]
    assert fsdp["components"]["peak"]["within"], fsdp["components"]["peak"]
    # gathered in bf16, reduce-scattered in fp32: what the planner counts (it counted fp32
    # for both until the simulation showed the difference)
    assert fsdp["comm"]["within"] and fsdp["why"] == [], fsdp


def test_zero_rank_holds_its_partition_and_the_rank_is_chosen():
    cfg = small()
    found = simulate(cfg, 64, variants=(VARIANTS[1],))
    fullest = found["variants"]["zero"]
    last = simulate(cfg, 64, variants=(VARIANTS[1],), rank=63)["variants"]["zero"]
    assert fullest["optimizer"] > 0
    assert last["rank"] == 63 and last["optimizer"] < fullest["optimizer"]


def test_a_parameter_that_cannot_shard_gives_one_line(monkeypatch):
    built = models.build_model

    def with_scalar(cfg, vocab):
        net = built(cfg, vocab)
        net.blocks[0].register_parameter("temperature", torch.nn.Parameter(torch.ones(())))
        return net

    monkeypatch.setattr(models, "build_model", with_scalar)
    found = simulate(small(), 8, variants=(VARIANTS[2],))
    line = found["variants"]["fsdp"]["failed"]
    assert "\n" not in line and "rank 0 of 8" in line and "scalar" in line


@pytest.mark.parametrize("cfg, W, rank, words", [
    (small(), 8, 8, "--simulate-rank 8"),
    (small(precision="fp16"), 8, None, "fp16"),
], ids=["rank-outside-world", "fp16"])
def test_a_wrong_setting_is_one_user_error(cfg, W, rank, words):
    with pytest.raises(UserError) as err:
        simulate(cfg, W, rank=rank)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_entry_points_print_the_table(capsys):
    cfg = small()
    result, _ = predicted(cfg, 4)
    parser = argparse.ArgumentParser()
    add_simulate_arguments(parser.add_argument_group("plan options"))
    ns = parser.parse_args(["--simulate", "--simulate-rank", "0"])
    run_simulate(ns, cfg, 4, result)
    out = capsys.readouterr().out
    assert "fsdp (no reshard)" in out and "comm/step" in out
    assert set(result["simulated"]["variants"]) == {v.label for v in VARIANTS}


@pytest.mark.parametrize("sync", ["every", "last"])
def test_accumulation_agrees_with_the_formulas(sync):
    """--grad-accum 2 simulated (the tracker's per-module records cleared between
    micro-steps): the gradients the first micro-step leaves — ddp/zero's beside DDP's
    buckets, FSDP's shards (`every`) or unsharded gradients (`last`) — as predicted, and
    the peak's moment is the last micro-step's backward."""
    cfg = small(grad_accum=2)
    cfg.dist.strategy, cfg.dist.fsdp_grad_sync = "fsdp", sync  # (as --strategy fsdp …)
    result, rows = predicted(cfg, 8)
    found = compare_all(cfg, simulate(cfg, 8, predicted=rows), rows)
    for label, v in found["variants"].items():
        assert "components" in v, (label, v)
        off = {n: c for n, c in v["components"].items() if not c["within"]}
        assert not off and v["why"] == [], (label, off, v["why"])
        assert v["moment"].startswith("backward"), (label, v["moment"])


def test_hsdp_with_tp_simulates_at_1024_ranks():
    """tp 2 inside 8 replica groups of 64 (issue 44): the row simulates (FSDP2 joins the
    data-parallel and tensor-parallel meshes into one inside the fake step: before this,
    it failed), each rank's parameters and optimizer state as the formulas give them, and
    the communication — TP's functional collectives sized over its 2 ranks, FSDP's over
    64, the replicas' over 8 — within 10 % of the formulas (0.996). (Activations: see
    docs/plan.md — the real 4-rank measurement agrees with the formulas; the fake step
    does not yet, and the comparison says so.)"""
    v = mesh_variant(8, 64, tp=2)
    cfg = small(optimizer="adamw")
    result = plan(cfg, 1024, device(None), 0.4, None, None, extra=(v,))
    rows = {r["strategy"]: r for r in result["rows"]}
    found = compare_all(cfg, simulate(cfg, 1024, variants=(v,), predicted=rows), rows)
    got = found["variants"][v.label]
    assert "components" in got, got
    for name in ("parameters", "optimizer"):
        assert got["components"][name]["within"], (name, got["components"][name])
    by_op = got["comm"]["by_op"]
    assert by_op["all_reduce"] > 0 and by_op["all_gather_into_tensor"] > 0, by_op
    assert got["comm"]["within"], got["comm"]
