"""`phalanx plan --dp-replicate R --dp-shard S` (issue 44, plan for every built layout):
an HSDP row beside the 1-D ones. Its memory is fsdp's over S ranks (a replica group holds
what fsdp over S would: FSDP2's all-reduce of the gradient shards runs in place); its
communication is fsdp's over S plus a ring all-reduce of each rank's gradient shard over
the R groups, once per optimizer step. `--measure` checks it on 4 gloo ranks
(tests/e2e/test_plan_layouts.py)."""

from __future__ import annotations

import json

import pytest

from phalanx import cli
from phalanx.config.flags import resolve
from phalanx.plan import estimate
from phalanx.plan import formulas as f
from phalanx.plan.recommend import comm_passes, facts_for


def config(*argv: str):
    ns = cli.build_parser().parse_args(["plan", "--n-layer", "2", "--n-embd", "64",
                                    "--n-head", "2", "--block-size", "64", *argv])
    return resolve(ns)


def test_hsdp_holds_what_fsdp_over_its_shard_group_holds():
    cfg = config()
    v, fsdp = estimate.mesh_variant(2, 4), estimate.VARIANTS[2]
    facts = facts_for(cfg, variant=v)
    assert estimate.peak(facts, v, 8, False) == estimate.peak(facts, fsdp, 4, False)
    assert estimate.peak(facts, v, 8, False)["peak"] > estimate.peak(facts, fsdp, 8,
                                                                     False)["peak"]


def test_hsdp_sends_fsdps_bytes_over_its_group_and_all_reduces_the_shards():
    """The shards' all-reduce at every gradient sync: each of the 3 micro-steps by
    default, the last only with --fsdp-grad-sync last."""
    for sync, syncs in (("every", 3), ("last", 1)):
        cfg = config("--grad-accum", "3", "--strategy", "fsdp", "--fsdp-grad-sync", sync)
        v, fsdp = estimate.mesh_variant(2, 4), estimate.VARIANTS[2]
        facts = facts_for(cfg, variant=v)
        inside = comm_passes(cfg, facts, fsdp, 4)
        shard = f.gathered_bytes(facts.param_shapes, 4, facts.reduced) // 4
        assert comm_passes(cfg, facts, v, 8) == {
            **inside, "backward": inside["backward"] + syncs * 2 * (2 - 1) / 2 * shard}


def test_the_plan_shows_the_layouts_row_and_plans_the_rest_over_the_world(capsys):
    argv = ["plan", "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--block-size",
            "64", "--world-size", "8", "--gpu", "h100", "--json"]
    assert cli.main([*argv, "--dp-replicate", "2", "--dp-shard", "-1"]) == 0
    rows = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert list(rows) == ["ddp", "zero", "fsdp", "fsdp (no reshard)", "hsdp (2 × 4)"]
    assert rows["fsdp"]["peak"] < rows["hsdp (2 × 4)"]["peak"] < rows["ddp"]["peak"]
    assert rows["hsdp (2 × 4)"]["time"]["comm_bytes"] > 0
    assert cli.main([*argv, "--dp-shard", "-1"]) == 0  # fsdp over the world: its row
    rows = [r["strategy"] for r in json.loads(capsys.readouterr().out)["rows"]]
    assert rows == ["ddp", "zero", "fsdp", "fsdp (no reshard)"]


def test_fsdp_reduce_scatters_once_per_step_when_it_syncs_on_the_last_micro_step_only():
    """`--fsdp-grad-sync last` turns FSDP's gradient sync off for all but the last
    micro-step: one reduce-scatter per optimizer step, the all-gathers still every
    micro-step."""
    fsdp = estimate.VARIANTS[2]
    every = config("--grad-accum", "3", "--strategy", "fsdp", "--fsdp-grad-sync", "every")
    last = config("--grad-accum", "3", "--strategy", "fsdp", "--fsdp-grad-sync", "last")
    facts = facts_for(every, variant=fsdp)
    gather = f.ring_all_gather_bytes(f.gathered_bytes(facts.param_shapes, 4, facts.gathered), 4)
    scatter = f.ring_all_gather_bytes(f.gathered_bytes(facts.param_shapes, 4, facts.reduced), 4)
    assert comm_passes(every, facts, fsdp, 4)["backward"] == 3 * gather + 3 * scatter
    assert comm_passes(last, facts, fsdp, 4)["backward"] == 3 * gather + scatter
    assert comm_passes(last, facts, fsdp, 4)["forward"] == 3 * gather


def test_links_between_machines_time_each_group_at_its_slowest_link():
    """With --inter-node-busbw-gbs, groups that cross machines move at that speed: fsdp
    over 32 ranks of 8 per machine entirely; HSDP (4 × 8) keeps its shard group inside a
    machine and only its replica all-reduce crosses."""
    from phalanx.plan.recommend import comm_groups, link_seconds

    cfg = config("--nproc-per-node", "8")
    fast, slow = 400e9, 50e9
    v, fsdp = estimate.mesh_variant(4, 8), estimate.VARIANTS[2]
    inner, across = comm_groups(cfg, facts_for(cfg, variant=v), v, 32)
    got = link_seconds(inner, across, v, 32, 8, fast, slow)
    assert got["backward"] == inner["backward"] / fast + across["backward"] / slow
    assert got["forward"] == inner["forward"] / fast
    inner, across = comm_groups(cfg, facts_for(cfg, variant=fsdp), fsdp, 32)
    assert across == {}
    assert link_seconds(inner, across, fsdp, 32, 8, fast, slow)["forward"] == \
        inner["forward"] / slow
    odd = estimate.mesh_variant(8, 4)  # shard groups of 4 inside machines of 8: still inside
    inner, across = comm_groups(cfg, facts_for(cfg, variant=odd), odd, 32)
    assert link_seconds(inner, across, odd, 32, 8, fast, slow)["forward"] == \
        inner["forward"] / fast
    wide = estimate.mesh_variant(2, 16)  # shard groups of 16 span two machines of 8
    inner, across = comm_groups(cfg, facts_for(cfg, variant=wide), wide, 32)
    assert link_seconds(inner, across, wide, 32, 8, fast, slow)["forward"] == \
        inner["forward"] / slow


def test_links_under_tp_time_the_tp_group_and_the_strided_shard_group():
    """Under TP (rank ((r·S) + s)·T + t) a TP group is T consecutive ranks and a shard
    group S ranks T apart: with T = 2 and S = 8 the shard group spans 16 ranks, two
    machines of 8, while each TP group stays inside one; with S = 4 both stay inside."""
    from phalanx.plan.recommend import comm_groups, link_seconds, tp_bytes

    cfg = config("--nproc-per-node", "8")
    fast, slow = 400e9, 50e9
    for S, shard_bw in ((8, slow), (4, fast)):
        v = estimate.mesh_variant(32 // (S * 2), S, 2)
        facts = facts_for(cfg, variant=v)
        inner, across = comm_groups(cfg, facts, v, 32)
        tp = tp_bytes(cfg, facts, v)
        assert 0 < tp < inner["exposed"]
        got = link_seconds(inner, across, v, 32, 8, fast, slow, tp)
        assert got["forward"] == inner["forward"] / shard_bw
        assert got["exposed"] == pytest.approx((inner["exposed"] - tp) / shard_bw + tp / fast
                                               + across.get("exposed", 0.0) / slow)


def test_the_plan_recommends_hsdp_when_the_network_between_machines_is_slow(capsys):
    argv = ["plan", "--n-layer", "4", "--n-embd", "256", "--n-head", "4", "--block-size",
            "256", "--world-size", "32", "--nproc-per-node", "8", "--gpu", "h100",
            "--dp-replicate", "4", "--dp-shard", "8", "--json"]
    assert cli.main(argv) == 0
    one = json.loads(capsys.readouterr().out)
    assert cli.main([*argv, "--inter-node-busbw-gbs", "25"]) == 0
    two = json.loads(capsys.readouterr().out)
    rows = {r["strategy"]: r["time"] for r in two["rows"]}
    before = {r["strategy"]: r["time"] for r in one["rows"]}
    assert rows["fsdp"]["comm_s"] > 5 * before["fsdp"]["comm_s"]  # all of it crosses
    assert rows["hsdp (4 × 8)"]["comm_s"] < rows["fsdp"]["comm_s"] / 3
    assert rows["fsdp"]["comm_bytes"] == before["fsdp"]["comm_bytes"]  # the same bytes
    assert two["inter_busbw"] == 25e9 and two["per_machine"] == 8
    assert two["recommendation"].startswith("hsdp (4 × 8): it fits"), two["recommendation"]
    assert not one["recommendation"].startswith("hsdp"), one["recommendation"]


def test_links_between_machines_need_machines(capsys):
    argv = ["plan", "--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--block-size",
            "64", "--world-size", "8", "--gpu", "h100", "--inter-node-busbw-gbs", "50"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "this plan has one machine (8 ranks, --nproc-per-node not given)" in err
    assert cli.main([*argv[:-1], "0", "--nproc-per-node", "4"]) == 2
    assert "must be positive" in capsys.readouterr().err
