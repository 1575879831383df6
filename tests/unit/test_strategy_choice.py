"""The strategy is decided once (`choose`), into one value carrying its options, and
`phalanx.init` builds that value as it is."""

from __future__ import annotations

import pytest

from phalanx.config.sections import build_config
from phalanx.config.strategy import DDPOptions, choose, choose_for_script
from phalanx.plan import timing
from phalanx.plan.estimate import VARIANTS, Variant, minigpt_facts, moments


def test_no_strategy_named_the_world_decides_and_the_options_come_along():
    cfg = build_config({"dist": {"bucket_cap_mb": 1, "find_unused_parameters": True}})
    one, two = choose(cfg.dist, 1, 1), choose(cfg.dist, 2, 1)
    assert (one.name, one.world, one.kwargs()) == ("single", 1, {})
    assert (two.name, two.world) == ("ddp", 2)
    assert two.options.bucket_cap_mb == 1 and two.options.find_unused_parameters is True


@pytest.mark.parametrize("name", ["ddp", "zero"])
def test_accumulation_turns_the_static_graph_off_by_the_specs_rule(name):
    cfg = build_config({"dist": {"strategy": name, "static_graph": True}})
    assert choose(cfg.dist, 2, grad_accum=1).options.static_graph is True
    assert choose(cfg.dist, 2, grad_accum=4).options.static_graph is False


def test_a_script_gets_exactly_the_options_it_gives():
    choice = choose_for_script("ddp", 2, bucket_cap_mb=1, static_graph=True)
    assert choice.options == DDPOptions(bucket_cap_mb=1, static_graph=True)
    assert choose_for_script(None, 1).name == "single" and choose_for_script(None, 3).name == "ddp"


def test_init_builds_the_choice_it_is_given_and_only_for_its_world():
    import phalanx

    with pytest.raises(ValueError, match="chosen for 2 rank.*joined a job of 1"):
        phalanx.init(seed=0, threads=1, strategy=choose_for_script("ddp", 2))
    with pytest.raises(TypeError, match="carries its options; bucket_cap_mb given"):
        phalanx.init(seed=0, threads=1, strategy=choose_for_script("ddp", 1), bucket_cap_mb=1)


def test_the_planner_reads_what_each_strategy_shards_from_its_spec():
    facts = minigpt_facts(L=2, H=2, C=32, T=16, V=256, B=2, bias=True)
    peak = {v.label: moments(facts, v, 4, False)["optimizer step"] for v in VARIANTS}
    assert peak["zero"]["optimizer"] < peak["ddp"]["optimizer"]  # ZeRO: 1/W of the state
    assert peak["zero"]["parameters"] == peak["ddp"]["parameters"]  # whole on every rank
    assert peak["fsdp"]["parameters"] < peak["ddp"]["parameters"]
    assert Variant("fsdp", "fsdp").sharded and not Variant("zero", "zero").sharded
    zero = timing.comm_per_pass("zero", True, 100, 100, 4, 1)
    assert zero["exposed"] > 0 == timing.comm_per_pass("ddp", True, 100, 100, 4, 1)["exposed"]
