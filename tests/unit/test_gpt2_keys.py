"""checkpoint/gpt2.py in one process: a GPT-2 checkpoint written by transformers (the tanh
GELU of OpenAI's) loads into MiniGPT tensor for tensor, with a note on the GELU; a model
that is not GPT-2's shape, or a checkpoint of another size, is refused in one line."""

from __future__ import annotations

import pytest
import torch

from phalanx.config.sections import ModelConfig
from phalanx.errors import UserError
from phalanx.models.minigpt import GPTConfig, MiniGPT

SHAPE = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=40, bias=True,
             rope=False, activation="gelu", tie_embeddings=True)


def _gpt2_dir(tmp_path, base: bool = False, **changes):
    transformers = pytest.importorskip("transformers", reason="transformers is not "
                                       "installed (the `test` extra has it)")
    torch.manual_seed(1)
    config = transformers.GPT2Config(vocab_size=40, n_positions=8, n_embd=16, n_layer=2,
                                     n_head=2, activation_function="gelu_new", bos_token_id=0,
                                     eos_token_id=0, **changes)
    model = (transformers.GPT2Model if base else transformers.GPT2LMHeadModel)(config)
    model.save_pretrained(tmp_path / "hf")
    return model


def test_a_gpt2_checkpoint_loads_into_minigpt_tensor_for_tensor(tmp_path):
    from phalanx.checkpoint.gpt2 import load_gpt2

    hf = _gpt2_dir(tmp_path)
    model = MiniGPT(GPTConfig(**SHAPE))
    note = load_gpt2(model, tmp_path / "hf", model.config)
    assert "activation_function `gelu_new`" in note and "close to that model's" in note
    theirs = dict(hf.named_parameters())
    assert torch.equal(model.blocks[1].attn.c_attn.weight,
                       theirs["transformer.h.1.attn.c_attn.weight"].detach().t())
    assert torch.equal(model.wpe.weight, theirs["transformer.wpe.weight"].detach())
    assert model.lm_head.weight is model.wte.weight  # still tied
    assert torch.equal(model.lm_head.weight, theirs["transformer.wte.weight"].detach())


def test_names_without_transformer_as_openais_gpt2_files_have_them(tmp_path):
    from phalanx.checkpoint.gpt2 import load_gpt2

    base = _gpt2_dir(tmp_path, base=True)  # GPT2Model: `h.0.…`, `wte.weight`
    model = MiniGPT(GPTConfig(**SHAPE))
    load_gpt2(model, tmp_path / "hf", model.config)
    assert torch.equal(model.blocks[0].mlp.c_fc.weight, base.h[0].mlp.c_fc.weight.detach().t())
    assert torch.equal(model.ln_f.bias, base.ln_f.bias.detach())


@pytest.mark.parametrize("changes, found", [
    ({"tie_word_embeddings": False}, "has an output head of its own"),
    ({"activation_function": "relu"}, "activation_function `relu`; MiniGPT in GPT-2's shape "
                                      "computes GELU"),
])
def test_what_minigpt_cannot_hold_is_refused(tmp_path, changes, found):
    from phalanx.checkpoint.gpt2 import load_gpt2

    transformers = pytest.importorskip("transformers", reason="transformers is not "
                                       "installed (the `test` extra has it)")
    config = transformers.GPT2Config(vocab_size=40, n_positions=8, n_embd=16, n_layer=2,
                                     n_head=2, bos_token_id=0, eos_token_id=0,
                                     **{"activation_function": "gelu_new", **changes})
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    model = MiniGPT(GPTConfig(**SHAPE))
    with pytest.raises(UserError, match=found):
        load_gpt2(model, tmp_path / "hf", model.config)


def test_a_checkpoint_of_another_size_is_refused_in_one_line(tmp_path):
    from phalanx.checkpoint.gpt2 import load_gpt2

    _gpt2_dir(tmp_path)
    model = MiniGPT(GPTConfig(**{**SHAPE, "block_size": 16}))
    with pytest.raises(UserError, match=r"`transformer.wpe.weight` is \(8, 16\); this "
                                        r"MiniGPT's is \(16, 16\): set --n-layer"):
        load_gpt2(model, tmp_path / "hf", model.config)


def test_init_from_without_model_needs_gpt2s_shape():
    with pytest.raises(UserError, match="`--init-from hf` without `--model` needs MiniGPT in "
                                        "GPT-2's architecture.*it needs --bias --no-rope "
                                        "--activation gelu --tie-embeddings \\(`--preset "
                                        "gpt2-124m` sets them all\\)"):
        ModelConfig(init_from="hf")
    ModelConfig(init_from="hf", preset="gpt2-124m", **{k: v for k, v in SHAPE.items()
                                                       if k in ("bias", "rope", "activation",
                                                                "tie_embeddings")})
