"""The tensor-parallel plans (strategies/tensor_parallel.py): MiniGPT's own, the one a
transformers config ships, and every refusal in one line — no process group needed."""

from __future__ import annotations

import pytest
import torch.nn as nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from phalanx.config.sections import build_config
from phalanx.errors import UserError
from phalanx.models.minigpt import GPTConfig, MiniGPT
from phalanx.models.tp_styles import ForkRNGByRank
from phalanx.strategies.tensor_parallel import checked_plan


def test_minigpts_plan_splits_attention_by_heads_and_the_mlp_megatron_style():
    plan = checked_plan(MiniGPT(GPTConfig(n_layer=2, n_head=4, n_embd=32)), 2)
    assert isinstance(plan["blocks.1.mlp.c_fc"], ColwiseParallel)
    assert isinstance(plan["blocks.1.mlp.c_proj"], RowwiseParallel)
    assert isinstance(plan["blocks.0.attn.c_proj"], RowwiseParallel)
    assert isinstance(plan["blocks.0.attn.core"], ForkRNGByRank)
    assert "blocks.0.attn.c_attn" not in plan  # q, k, v fused: whole, split by heads after
    # the vocabulary (256) split over 2: the embedding by rows, the head by columns, its
    # logits left split (loss parallel)
    assert isinstance(plan["wte"], RowwiseParallel) and isinstance(plan["lm_head"],
                                                                   ColwiseParallel)
    assert not plan["lm_head"].use_local_output
    odd = checked_plan(MiniGPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=255)), 2)
    assert "wte" not in odd and "lm_head" not in odd  # 255 over 2: both stay whole
    with pytest.raises(UserError, match=r"`--tp 8`: --n-head 4 does not divide into 8"):
        checked_plan(MiniGPT(GPTConfig(n_layer=1, n_head=4, n_embd=32)), 8)


def test_the_head_count_is_checked_before_launch():
    with pytest.raises(UserError, match=r"`--tp 2`: --n-head 3 does not divide into 2"):
        build_config({"model": {"n_head": 3, "n_embd": 48}, "dist": {"tp": 2}})


def llama(kv_heads: int):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                       "(the `test` extra has it)")
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=kv_heads, vocab_size=64)
    return transformers.LlamaForCausalLM(config)


def test_a_transformers_model_takes_the_plan_its_config_ships():
    plan = checked_plan(llama(2), 2)
    assert isinstance(plan["model.layers.1.self_attn.k_proj"], ColwiseParallel)
    assert isinstance(plan["model.layers.0.mlp.down_proj"], RowwiseParallel)
    assert len(plan) == 2 * 7 and "lm_head" not in plan  # 7 per layer; the head whole
    with pytest.raises(UserError, match=r"LlamaConfig.num_key_value_heads = 1 does not "
                                        r"divide into 2 ranks"):
        checked_plan(llama(1), 2)


def test_a_style_phalanx_does_not_map_is_refused():
    model = llama(2)
    model.config.base_model_tp_plan = {"layers.*.self_attn.q_proj": "colwise_rep"}
    with pytest.raises(UserError, match=r"splits `layers.\*.self_attn.q_proj` as "
                                        r"`colwise_rep`, which Phalanx does not map"):
        checked_plan(model, 2)


def test_a_model_without_a_plan_or_with_a_wrong_name_is_refused():
    with pytest.raises(UserError, match=r"`--tp 2`: Sequential has no tensor-parallel plan"):
        checked_plan(nn.Sequential(nn.Linear(4, 4)), 2)

    class Named(nn.Sequential):
        def tp_plan(self) -> dict:
            return {"0": ColwiseParallel(), "missing": RowwiseParallel()}

    with pytest.raises(UserError, match=r"names `missing`, which Named does not have"):
        checked_plan(Named(nn.Linear(4, 4)), 2)


class Mlp(nn.Module):
    """A script's own model with no plan of its own."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.up = nn.Linear(4, hidden)
        self.down = nn.Linear(hidden, 4)
        self.norm = nn.LayerNorm(4)


def test_a_scripts_plan_is_taken_as_given_strings_as_torchs_styles():
    plan = checked_plan(Mlp(), 2, {"up": "colwise", "down": RowwiseParallel(),
                                   "embed": "rowwise"})
    assert isinstance(plan["up"], ColwiseParallel) and isinstance(plan["embed"], RowwiseParallel)
    assert isinstance(plan["down"], RowwiseParallel)
    built = checked_plan(Mlp(), 2, lambda model: {"up": "colwise"})  # a function of the model
    assert list(built) == ["up"] and isinstance(built["up"], ColwiseParallel)
    # the script's plan replaces the model's own
    assert list(checked_plan(MiniGPT(GPTConfig(n_layer=1, n_head=2, n_embd=16)), 2,
                             {"blocks.0.mlp.c_fc": "colwise"})) == ["blocks.0.mlp.c_fc"]


def test_a_scripts_plan_that_cannot_apply_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"splits `up` as `colwise_rep`; Phalanx maps "
                                        r"colwise, rowwise"):
        checked_plan(Mlp(), 2, {"up": "colwise_rep"})
    with pytest.raises(UserError, match=r"entry for `up` is a int, not a torch ParallelStyle"):
        checked_plan(Mlp(), 2, {"up": 3})
    with pytest.raises(UserError, match=r"run.setup\(tp_plan=\) got a list"):
        checked_plan(Mlp(), 2, ["up"])
    with pytest.raises(UserError, match=r"splits `norm` by columns, but it is a LayerNorm; "
                                        r"torch's column and row styles split nn.Linear and "
                                        r"nn.Embedding only\. Leave `norm` out"):
        checked_plan(Mlp(), 2, {"norm": "colwise"})
    with pytest.raises(UserError, match=r"splits `up` by columns, and its out_features = 6 "
                                        r"does not divide into 4 ranks"):
        checked_plan(Mlp(hidden=6), 4, {"up": "colwise"})
    with pytest.raises(UserError, match=r"splits `embed` by rows, and its num_embeddings = "
                                        r"10 does not divide into 4 ranks"):
        checked_plan(Mlp(hidden=8), 4, {"embed": "rowwise"})
    with pytest.raises(UserError, match=r"names `missing`, which Mlp does not have"):
        checked_plan(Mlp(), 2, {"missing": "colwise"})


def test_gpt2s_conv1d_is_refused_in_one_line_saying_why():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                       "(the `test` extra has it)")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8))
    with pytest.raises(UserError, match=r"GPT2LMHeadModel has no tensor-parallel plan\. Pass "
                                        r"one to run.setup\(model, tp_plan="):
        checked_plan(model, 2)
    with pytest.raises(UserError, match=r"`transformer.h.0.mlp.c_fc` by columns, but it is a "
                                        r"Conv1D; .* \(transformers' Conv1D, GPT-2's, holds its "
                                        r"weight transposed: GPT-2 cannot be split"):
        checked_plan(model, 2, {"transformer.h.0.mlp.c_fc": "colwise"})
