"""The planner follows the config's tokenizer, MiniGPT's options and the optimizer: its
shapes are MiniGPT's own parameters, its optimizer groups the trainer's, and `gpt2-124m`
is GPT-2 small's 124,439,808 parameters."""

from __future__ import annotations

import io
import itertools
import json

import pytest
import torch
from rich.console import Console

from phalanx.bench.flops import matmul_params
from phalanx.config.data_spec import vocab_size_of
from phalanx.config.sections import build_config, from_dict
from phalanx.models.build import gpt_config
from phalanx.models.minigpt import GPTConfig, MiniGPT
from phalanx.models.shapes import minigpt_matmul_params, minigpt_param_shapes
from phalanx.plan import formulas as f
from phalanx.plan.devices import device
from phalanx.plan.estimate import VARIANTS, minigpt_facts, optimizer_bytes, optimizer_layout
from phalanx.plan.recommend import facts_for, parameter_count, plan, planned_vocab
from phalanx.plan.tables import print_plan
from phalanx.runtime.muon import hidden_matrices, muon_adamw
from phalanx.runtime.optim import adamw
from phalanx.train.cpu_estimate import flops_per_step

OPTIONS = list(itertools.product([False, True], repeat=3))  # bias, rope, tied


def meta_gpt(**kw) -> MiniGPT:
    with torch.device("meta"):
        return MiniGPT(GPTConfig(**kw))


@pytest.mark.parametrize("bias,rope,tied", OPTIONS)
def test_shapes_are_minigpts_parameters_for_every_option(bias, rope, tied):
    for V, T in ((50, 16), (300, 7)):
        model = meta_gpt(vocab_size=V, block_size=T, n_layer=3, n_head=2, n_embd=8,
                         bias=bias, rope=rope, tie_embeddings=tied, qk_norm=True,
                         activation="relu2", logit_softcap=30.0)
        assert minigpt_param_shapes(3, 8, V, T, bias, rope=rope, tied=tied) == \
            [tuple(p.shape) for p in model.parameters()]
        assert minigpt_matmul_params(3, 8, V, T, bias, rope=rope, tied=tied) == \
            model.num_params() == matmul_params(model)  # FLOPs' N: no position table


@pytest.mark.parametrize("bias,rope,tied", OPTIONS)
def test_optimizer_groups_and_state_copies_are_the_trainers(bias, rope, tied):
    # V = 4C: the MLP's up-projection has V outputs, which Muon takes for a head
    for V in (50, 32):
        model = MiniGPT(GPTConfig(vocab_size=V, block_size=6, n_layer=2, n_head=2,
                                  n_embd=8, bias=bias, rope=rope, tie_embeddings=tied))
        params = list(model.parameters())
        layout = f.minigpt_layout(2, 8, V, 6, bias, rope=rope, tied=tied)
        for name, opt in (("muon", muon_adamw(model, params, lr=1e-3, muon_lr=0.02,
                                              weight_decay=0.1, betas=(0.9, 0.99),
                                              vocab_size=V)),
                          ("adamw", adamw(params, lr=1e-3, weight_decay=0.1,
                                          betas=(0.9, 0.99), device=torch.device("cpu")))):
            copies, groups = optimizer_layout(layout, V, name)
            group_of = {id(p): i for i, g in enumerate(opt.param_groups) for p in g["params"]}
            assert list(groups) == [group_of[id(p)] for p in params]
            hidden = hidden_matrices(model, V) if name == "muon" else set()
            assert list(copies) == [1 if id(p) in hidden else 2 for p in params]


def test_muon_state_by_hand_per_strategy():
    # L=1, C=4, V=10, T=3: hidden 48+16+64+64 = 192 elements (1 copy); wte 40, wpe 12,
    # three norms 12 (2 copies)
    facts = minigpt_facts(1, 2, 4, 3, 10, 2, bias=False, optimizer="muon")
    ddp, zero, fsdp = VARIANTS[0], VARIANTS[1], VARIANTS[2]
    assert optimizer_bytes(facts, ddp, 2) == (192 + 2 * 64) * 4
    # FSDP shards dim 0 (⌈d0/2⌉ rows): Muon 24+8+32+32, AdamW 2·(20+8+2+2+2)
    assert optimizer_bytes(facts, fsdp, 2) == (96 + 68) * 4
    # ZeRO, group by group, largest first, to the emptier rank (ties: rank 0):
    # hidden fc 64→r0, proj 64→r1, qkv 48→r0, attn proj 16→r1; wte 40→r1, wpe 12→r0;
    # norms 4→r1, 4→r0, 4→r1 — rank 1 holds 64+16 + 2·(40+4+4) = 176 state elements
    assert f.zero_assignment(facts.param_shapes, 2, facts.groups()) == \
        [1, 0, 1, 0, 1, 0, 0, 1, 1]
    assert optimizer_bytes(facts, zero, 2) == 176 * 4
    adam = minigpt_facts(1, 2, 4, 3, 10, 2, bias=False)
    assert optimizer_bytes(adam, ddp, 2) == f.adamw_state_bytes(256 * 4)


def test_the_plan_follows_tokenizer_rope_and_tying():
    cfg = build_config({"data": {"tokenizer": "bpe:4096"},
                        "model": {"rope": True, "tie_embeddings": False}})
    facts = facts_for(cfg)
    model = meta_gpt(**vars(gpt_config(cfg, 4096)))
    assert facts.param_shapes == [tuple(p.shape) for p in model.parameters()]
    assert facts.root_shapes == [(4096, 128), (128,), (4096, 128)]  # wte, ln_f, lm_head
    assert facts.logits == 8 * 64 * 4096 * 4
    assert facts.buffers == sum(b.numel() * 4 for b in model.buffers())  # rotary tables


def test_gpt2_124m_is_gpt2_small_with_its_tokenizer():
    cfg = build_config({"model": {"preset": "gpt2-124m"}})
    assert cfg.data.tokenizer == "bpe:50257" and planned_vocab(cfg) == (50257, None)
    gpt2 = meta_gpt(**vars(gpt_config(cfg, 50257)))
    n = sum(p.numel() for p in gpt2.parameters())
    assert n == 124_439_808  # GPT-2 small's own count
    result = plan(cfg, 8, device("a100-40g"), 0.4, 312e12, 230e9)
    assert result["parameters"] == n and result["vocab_size"] == 50257
    assert from_dict(cfg.to_dict()) == cfg  # a resumed run rebuilds it without the preset
    # the user's tokenizer wins over the preset's; the model follows it
    by_bytes = build_config({"model": {"preset": "gpt2-124m"},
                             "data": {"tokenizer": "bytes"}})
    small = meta_gpt(**vars(gpt_config(by_bytes, 256)))
    assert parameter_count(by_bytes) == sum(p.numel() for p in small.parameters()) < 87e6
    assert build_config({}).data.tokenizer == build_config(
        {"model": {"preset": "tiny"}}).data.tokenizer  # other presets leave data alone


def test_vocab_size_of_each_tokenizer_spelling(tmp_path):
    assert vocab_size_of("bytes") == 256
    assert vocab_size_of("bpe") == 4096 and vocab_size_of("bpe:50257") == 50257
    bpe = tmp_path / "tokenizer.json"
    bpe.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 7}},
                               "added_tokens": [{"id": 9, "content": "<eos>"}]}))
    assert vocab_size_of(str(bpe)) == 10  # largest id + 1, added tokens included
    unigram = tmp_path / "unigram.json"
    unigram.write_text(json.dumps({"model": {"type": "Unigram",
                                             "vocab": [["a", -1.0], ["b", -2.0]]}}))
    assert vocab_size_of(str(unigram)) == 2
    (tmp_path / "bad.json").write_text("not json")
    assert vocab_size_of(str(tmp_path / "bad.json")) is None
    assert vocab_size_of(str(tmp_path / "missing.json")) is None
    cfg = build_config({"data": {"tokenizer": str(tmp_path / "missing.json")}})
    vocab, note = planned_vocab(cfg)
    assert vocab == 256 and "could not be read" in (note or "")


def test_vocab_size_of_a_real_tokenizer_file_matches_the_loader(tmp_path):
    pytest.importorskip("tokenizers")
    from phalanx.data.tokenizer import load_tokenizer_file, train_bpe

    path = tmp_path / "tokenizer.json"
    train_bpe(["the quick brown fox jumps over the lazy dog " * 20], 300).tok.save(str(path))
    assert vocab_size_of(str(path)) == load_tokenizer_file(path).vocab_size


def test_cpu_estimate_counts_the_tokenizers_vocabulary():
    for tokenizer, V in (("bytes", 256), ("bpe:4096", 4096)):
        cfg = build_config({"data": {"tokenizer": tokenizer},
                            "model": {"rope": True, "tie_embeddings": False}})
        model = meta_gpt(**vars(gpt_config(cfg, V)))
        t, m = cfg.train, cfg.model
        tokens = t.micro_batch_size * t.grad_accum * m.block_size
        per_token = 6 * model.num_params() + 12 * m.n_layer * m.n_embd * m.block_size
        assert flops_per_step(cfg) == per_token * tokens


def test_muon_step_time_terms():
    from phalanx.plan import timing

    # 2×4 update: m=2, n=4 — 5 steps of 4·4·4 + 2·8
    assert f.newton_schulz_flops((4, 2)) == f.newton_schulz_flops((2, 4)) == 5 * (64 + 16)
    # fsdp all-gathers each hidden matrix's update after backward: exposed; ddp/zero don't
    assert timing.comm_per_pass("fsdp", True, 100, 100, 4, 1, muon_bytes=40)["exposed"] == 30
    assert timing.comm_per_pass("ddp", True, 100, 100, 4, 1, muon_bytes=40)["exposed"] == 0
    muon = build_config({"train": {"optimizer": "muon"}})
    rows = {r["strategy"]: r["time"] for r in
            plan(muon, 2, device("h100"), 0.4, 989e12, 100e9)["rows"]}
    adam = {r["strategy"]: r["time"] for r in
            plan(build_config({"train": {"optimizer": "adamw"}}), 2, device("h100"), 0.4,
                     989e12, 100e9)["rows"]}
    # the forward/backward compute is the optimizer's no more; its own term is
    assert all(rows[k]["compute_s"] == adam[k]["compute_s"] for k in rows)
    assert all(adam[k]["optimizer_s"] == 0 for k in adam)
    assert 0 < rows["zero"]["optimizer_s"] < rows["ddp"]["optimizer_s"]  # ZeRO: its share
    assert rows["fsdp"]["exposed_s"] > adam["fsdp"]["exposed_s"]
    for t in rows.values():
        assert t["step_s"] == pytest.approx(t["compute_s"] + t["optimizer_s"] + t["exposed_s"])


def test_the_time_table_shows_the_optimizer_and_its_compute_apart():
    """A 7 B MiniGPT's ddp step with Muon is ~4× AdamW's: the Newton–Schulz term is its
    own column, and the table says which optimizer was assumed."""
    for optimizer, said in (("muon", "optimizer muon: optim = Newton–Schulz"),
                            ("adamw", "optimizer adamw: optim = 0")):
        cfg = build_config({"model": {"n_layer": 32, "n_head": 32, "n_embd": 4096},
                            "train": {"optimizer": optimizer}})
        buf = io.StringIO()
        print_plan(plan(cfg, 8, device("h100"), 0.4, 989e12, 100e9),
                   Console(file=buf, width=80))
        text = " ".join(buf.getvalue().split())
        assert "optim ms" in text and said in text, text
