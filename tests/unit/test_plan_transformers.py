"""`phalanx plan --model` on transformers' causal LMs (issue 40.2): Llama, Mistral,
Qwen2 and GPT-2 from small configs are traced, and a 7 B Llama config is planned without
being built (meta device, fake tensors). It crashed with a 60-line traceback on every
Llama: the meta model was deep-copied inside FakeTensorMode."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from phalanx.errors import UserError
from phalanx.plan.user_model import load

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (the `test` extra has it: "
    "pip install -c constraints.txt -e '.[test]')")

FACTORIES = """
import transformers as t

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)

def llama(vocab_size=256):
    return t.LlamaForCausalLM(t.LlamaConfig(vocab_size=vocab_size, **SMALL))

def mistral(vocab_size=256):
    return t.MistralForCausalLM(t.MistralConfig(vocab_size=vocab_size, **SMALL))

def qwen2(vocab_size=256):
    return t.Qwen2ForCausalLM(t.Qwen2Config(vocab_size=vocab_size, **SMALL))

def gpt2(vocab_size=256):
    return t.GPT2LMHeadModel(t.GPT2Config(n_layer=2, n_embd=64, n_head=4,
                                          vocab_size=vocab_size, n_positions=64))

def llama_7b(vocab_size=32000):
    return t.LlamaForCausalLM(t.LlamaConfig(vocab_size=vocab_size))

class Uncopyable(t.GPT2LMHeadModel):
    def __deepcopy__(self, memo):
        raise TypeError("no copies of me")

def uncopyable(vocab_size=256):
    return Uncopyable(t.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=vocab_size,
                                   n_positions=64))
"""
T, V = 32, 256


@pytest.fixture
def factories(monkeypatch, tmp_path: Path):
    transformers.logging.set_verbosity_error()
    (tmp_path / "hf_factories.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "gpt2"])
def test_small_transformers_models_are_planned(factories, name):
    user = load(f"hf_factories:{name}", T, V, micro_batch=2)
    facts = user.facts(2)
    assert facts.logits == 2 * T * V * 4  # fp32 (B, T, V) logits
    assert user.n_params > 0 and facts.flops_per_token > 0
    assert user.n_blocks == 2  # the decoder layers: FSDP's blocks


def test_a_7b_llama_config_is_planned_not_built(factories):
    user = load("hf_factories:llama_7b", 4096, 32000, micro_batch=1)
    assert 6.5e9 < user.n_params < 7e9
    assert 0.5 * 6 * user.n_params < user.facts(1).flops_per_token < 2 * 6 * user.n_params


def test_a_model_that_cannot_be_copied_is_one_line(factories):
    with pytest.raises(UserError, match=r"copying it raised TypeError: no copies of me"):
        load("hf_factories:uncopyable", T, V, micro_batch=1).facts(1)
