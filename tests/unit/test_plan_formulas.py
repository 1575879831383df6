"""The planner's arithmetic against values computed by hand (phalanx.plan)."""

from __future__ import annotations

import json

import pytest

from phalanx.errors import UserError
from phalanx.plan import formulas as f
from phalanx.plan import timing
from phalanx.plan.devices import GPUS, busbw_from, device
from phalanx.plan.estimate import VARIANTS, minigpt_facts, peak

# L=1 block, C=4 wide, V=10 tokens, T=3 positions, no bias
SHAPES = [(10, 4), (3, 4), (4,), (12, 4), (4, 4), (4,), (16, 4), (4, 16), (4,)]


def test_parameter_shapes_and_counts():
    assert f.minigpt_param_shapes(1, 4, 10, 3, bias=False) == SHAPES
    assert sum(map(f.numel, SHAPES)) == 40 + 12 + 4 + 48 + 16 + 4 + 64 + 64 + 4 == 256
    with_bias = f.minigpt_param_shapes(1, 4, 10, 3, bias=True)
    assert sum(map(f.numel, with_bias)) == 256 + 11 * 4 + 4  # 9C linear + 2C norms + ln_f


def test_sharding_pads_dim_0():
    assert f.shard_numel((10, 4), 3) == 4 * 4  # ⌈10/3⌉ rows of 4
    assert f.param_bytes([(10, 4), (4,)], 3, sharded=True) == (16 + 2) * 4
    assert f.param_bytes([(10, 4), (4,)]) == 44 * 4


def test_zero_partitions_whole_parameters_greedily():
    assert f.zero_partition_bytes([(100,), (60,), (50,), (10,)], 2) == 110 * 4
    assert f.zero_partition_bytes([(5,), (3,), (3,)], 2) == 6 * 4  # the fuller rank
    assert f.adamw_state_bytes(1000) == 2000


def test_activation_terms():
    assert f.minigpt_block_activations(2, 3, 4, 2) == 16 * 24 * 4 + 2 * 2 * 6 * 4 + 12 * 4
    assert f.minigpt_head_activations(2, 3, 4, 10) == 192 + 48 + 240 + 96
    assert f.mlp_backward_in_flight(2, 3, 4) == 5 * 24 * 4 + 4 * 16 * 4
    assert f.minigpt_activations(2, 3, 4, 2, 10, 1) == 1680 + 576
    assert f.minigpt_activations(2, 3, 4, 2, 10, 1, checkpointed=True) == 96 + 576


def test_fsdp_collectives_are_padded_to_a_multiple_of_the_ranks():
    assert f.gathered_bytes([(768, 64)], 1024) == 1024 * 64 * 4  # one row each, 256 empty
    assert f.gathered_bytes([(768, 64)], 2) == f.param_bytes([(768, 64)])  # even: exact
    assert f.gathered_bytes([(3, 4), (5,)], 2, s=2) == (4 * 4 + 6) * 2


def test_communication_and_time_terms():
    assert f.ring_all_reduce_bytes(100, 4) == 150
    assert f.ring_all_gather_bytes(100, 4) == 75
    assert f.compute_seconds(6e9, 1000, 1e12, 0.5) == pytest.approx(12.0)
    assert f.minigpt_flops_per_token(1000, 2, 2, 8, 16) == 6000 + 12 * 2 * 2 * 4 * 16
    assert f.exposed_seconds(3.0, 2.0, 1.0) == 1.0 and f.exposed_seconds(1.0, 2.0, 1.0) == 0


def test_ddp_peak_by_hand():
    facts = minigpt_facts(1, 2, 4, 3, 10, 2, bias=False)
    got = peak(facts, VARIANTS[0], 2, checkpointed=False)
    # P = 256·4; backward start: saved 1680+576, logits 60·4, the loss's gradients 2·60·4
    assert (got["parameters"], got["gradients"], got["optimizer"]) == (1024, 1024, 2048)
    assert got["activations"] == 2256 + 240 + 480 and got["moment"] == "backward start"
    assert got["peak"] == 1024 + 1024 + 2048 + 2976


def test_fsdp_holds_a_shard_and_the_root():
    facts = minigpt_facts(1, 2, 4, 3, 10, 2, bias=False)
    got = peak(facts, VARIANTS[2], 2, checkpointed=False)
    shard = f.param_bytes(SHAPES, 2, sharded=True)
    # wte, wpe, ln_f gathered; wpe's 3 rows are padded to 4 (a multiple of W = 2)
    assert got["parameters"] == shard + (40 + 4 * 4 + 4) * 4
    assert got["optimizer"] == 2 * shard
    assert got["communication"] == (4 + 48 + 16 + 4 + 64 + 64) * 4  # one block prefetched


def test_comm_volume_per_strategy():
    assert timing.comm_per_pass("ddp", True, 100, 100, 4, 1) == \
        {"forward": 0.0, "backward": 150.0, "exposed": 0.0}
    assert timing.comm_per_pass("zero", True, 100, 100, 4, 1)["exposed"] == 75.0
    assert timing.comm_per_pass("fsdp", True, 100, 100, 4, 2) == \
        {"forward": 150.0, "backward": 300.0, "exposed": 0.0}
    assert timing.comm_per_pass("fsdp", False, 100, 100, 4, 1)["backward"] == 75.0
    t = timing.step_time(1, 3, 1.0, 1.0, {"forward": 150.0, "backward": 300.0,
                                          "exposed": 0.0}, busbw=100.0)
    assert (t.compute_s, t.comm_s, t.exposed_s, t.step_s) == (3.0, 4.5, 1.5, 4.5)


def test_devices(tmp_path):
    assert device("H100") is GPUS["h100"] and device(None).name == "cpu"
    with pytest.raises(UserError, match="unknown `--gpu tpu9`; known: h100, h200"):
        device("tpu9")
    doctor = tmp_path / "doctor.json"
    doctor.write_text(json.dumps({"checks": [], "bandwidth": [
        {"bytes": 1024, "busbw_gbs": 0.5}, {"bytes": 1 << 20, "busbw_gbs": 2.5}]}))
    assert busbw_from(str(doctor)) == 2.5e9
    doctor.write_text("{}")
    with pytest.raises(UserError, match="not the JSON of `phalanx doctor --json`"):
        busbw_from(str(doctor))


def test_autocast_and_low_precision_terms():
    # fp32 residual stream 2·24·4, 14·24·2 bf16 copies, weights 100·2, stats 96 + 48
    assert f.minigpt_block_activations_autocast(2, 3, 4, 2, 100) == \
        192 + 672 + 200 + 96 + 48
    assert f.minigpt_head_activations_autocast(2, 3, 4, 10) == 96 + 48 + 80 + 240 + 48 + 96
    ddp = minigpt_facts(1, 2, 4, 3, 10, 2, bias=False, s=2)
    fsdp = minigpt_facts(1, 2, 4, 3, 10, 2, bias=False, s=2, params_low=True)
    assert ddp.block_input == 24 * 4 and fsdp.block_input == 24 * 2  # fp32 vs bf16 stream
    assert (ddp.gathered, fsdp.gathered) == (4, 2)
    assert fsdp.block_saved == f.minigpt_block_activations(2, 3, 4, 2, s=2)


def test_checkpointed_forward_under_autocast_keeps_weight_copies():
    assert f.mlp_forward_transient(2, 3, 4, 2, 4) == 8 * 24 * 2 + 24 * 4
    facts = minigpt_facts(2, 2, 4, 3, 10, 2, bias=False, s=2)
    block = 4 + 48 + 16 + 4 + 64 + 64  # one block's parameters
    assert facts.cast_cache == block * 2
    got = peak(facts, VARIANTS[0], 2, checkpointed=True)
    from phalanx.plan.estimate import moments
    forward = moments(facts, VARIANTS[0], 2, checkpointed=True)["forward, last block"]
    assert forward["activations"] == 2 * (24 * 4 + block * 2) + f.mlp_forward_transient(
        2, 3, 4, 2, 4)
    assert got["peak"] >= sum(forward.values())
