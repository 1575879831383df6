"""`phalanx plan --model`: a user's model is traced at the planned micro-batch and
precision (an example is remade along dim 0), activations are linear in the micro-batch
(the largest that fits comes from two traces), compute comes from torch's FLOP counter,
and the fp32 trace matches what autograd keeps for real."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from phalanx.config.sections import build_config
from phalanx.plan.devices import RESERVED, device
from phalanx.plan.estimate import VARIANTS, moments, peak
from phalanx.plan.recommend import plan
from phalanx.plan.user_model import load

V, T = 256, 16
FACTORIES = """
import torch
from user_lm import ConvLM

def with_example(vocab_size=256, block_size=16):
    return ConvLM(vocab_size, width=32, layers=3), torch.zeros(2, block_size, dtype=torch.long)

def odd_example():
    return ConvLM(256, width=32, layers=3), {"idx": 1}
"""


@pytest.fixture
def factories(monkeypatch, tmp_path: Path):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))  # user_lm
    (tmp_path / "plan_factories.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))


def real_saved(model: torch.nn.Module, x: torch.Tensor) -> int:
    """What autograd keeps for backward on the CPU, each storage once, no parameters."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            kept[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(kept.values())


def test_the_example_is_remade_at_the_planned_micro_batch(factories):
    import user_lm

    user = load("plan_factories:with_example", T, V, micro_batch=8)
    facts = user.facts(8)
    assert facts.logits == 8 * T * V * 4  # the (8, T, V) fp32 logits, not the example's 2
    assert "dim 0 (2) was remade at the planned micro-batch 8" in user.scale_note(8)
    torch.manual_seed(0)
    model = user_lm.ConvLM(V, width=32, layers=3)
    assert facts.head_saved == real_saved(model, torch.zeros(8, T, dtype=torch.long))


def test_activations_are_a_line_in_the_micro_batch(factories):
    user = load("plan_factories:with_example", T, V, precision="bf16", micro_batch=4)
    for b in (1, 3, 8, 13):
        direct = load("plan_factories:with_example", T, V, precision="bf16", micro_batch=b)
        assert user.facts(b).head_saved == direct.facts(b).head_saved, b
        assert user.facts(b, sharded=True).head_saved == \
            direct.facts(b, sharded=True).head_saved, b


def test_bf16_is_planned_under_autocast_and_fsdp_in_two_bytes(factories):
    fp32 = load("plan_factories:with_example", T, V, micro_batch=8).facts(8)
    auto = load("plan_factories:with_example", T, V, precision="bf16", micro_batch=8)
    assert auto.facts(8).logits == fp32.logits // 2  # autocast's bf16 logits
    assert auto.facts(8).head_saved < fp32.head_saved
    assert auto.facts(8, sharded=True).head_saved < auto.facts(8).head_saved  # no fp32
    assert auto.facts(8, sharded=True).gathered == 2  # residual stream, no weight copies


def test_a_train_factory_is_traced_with_the_trainers_loss(factories):
    user = load("user_lm:conv_lm", T, V, micro_batch=4)
    facts = user.facts(4)
    assert facts.logits == 4 * T * V * 4
    assert facts.loss_grads == 2 * 4 * T * V * 4  # cross-entropy's two B·T·V gradients
    assert facts.tokens == 4 * T
    assert "FlopCounterMode" in user.flops_note(4)
    assert 0.5 * 6 * user.n_params < facts.flops_per_token < 2 * 6 * user.n_params


def test_a_users_plan_predicts_time_and_the_largest_micro_batch(factories):
    cfg = build_config({"model": {"factory": "plan_factories:with_example",
                                  "block_size": T},
                        "train": {"micro_batch_size": 8, "precision": "bf16"}})
    user = load(cfg.model.factory, T, V, precision="bf16", micro_batch=8)
    dev = device(None)  # the CPU: its RAM shared by the ranks; a small one
    dev = type(dev)("small", RESERVED + 64 * 2**20, 989e12, 360e9, "64 MiB usable")
    result = plan(cfg, 2, dev, 0.4, 989e12, 360e9, user)
    for row, v in zip(result["rows"], VARIANTS):
        assert row["time"]["step_s"] > 0
        n = row["largest_micro_batch"]
        assert n > 8
        assert peak(user.facts(n, v.sharded), v, 2, False)["peak"] <= result["budget_bytes"] < \
            peak(user.facts(n + 1, v.sharded), v, 2, False)["peak"]
    assert any("remade" in note for note in result["user_notes"])


def test_an_example_that_cannot_be_scaled_is_said(factories):
    user = load("plan_factories:odd_example", None, V, micro_batch=8)
    assert not user.scalable and "not applied" in user.scale_note(8)


def test_checkpointed_blocks_keep_only_their_inputs(factories):
    from torch.utils.checkpoint import checkpoint

    import user_lm

    user = load("plan_factories:with_example", T, V, micro_batch=8, checkpointed=True)
    facts = user.facts(8)
    model = user_lm.ConvLM(V, width=32, layers=3)
    x = torch.zeros(8, T, dtype=torch.long)
    plain = real_saved(model, x)
    for block in model.layers:  # what a checkpoint wrapper does to each block
        block.forward = lambda *a, _f=block.forward: checkpoint(_f, *a, use_reentrant=False)
    assert facts.n_blocks == 3 and facts.block_input == 8 * T * 32 * 4
    assert facts.head_saved + 3 * facts.block_input == real_saved(model, x) < plain
    assert facts.block_saved > facts.block_input  # one block recomputed in backward
    found = {m for v in VARIANTS for m in moments(facts, v, 2, True)}
    assert "block 2 backward" in found and "forward, last block" in found
