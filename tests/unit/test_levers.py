"""The speedrun levers MiniGPT takes (rope, QK-norm, ReLU², untied head, soft-capped
logits), the Muon + AdamW optimizer in one process, the wsd schedule, and the validation
loss per byte."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn

from phalanx.config.sections import build_config
from phalanx.models import build_model
from phalanx.models.minigpt import GPTConfig, MiniGPT
from phalanx.runtime.muon import MuonAdamW, hidden_matrices, muon_adamw, orthogonalize
from phalanx.train.schedule import lr_at

SMALL = dict(vocab_size=300, block_size=16, n_layer=2, n_head=2, n_embd=32)


def test_each_lever_changes_the_model_the_way_it_says():
    base = MiniGPT(GPTConfig(**SMALL))
    rope = MiniGPT(GPTConfig(**SMALL, rope=True))
    assert rope.wpe is None and base.wpe is not None  # no learned positions
    untied = MiniGPT(GPTConfig(**SMALL, tie_embeddings=False))
    assert untied.lm_head.weight is not untied.wte.weight
    assert base.lm_head.weight is base.wte.weight
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(untied) - n(base) == 300 * 32 and n(base) - n(rope) == 16 * 32
    x = torch.randint(0, 300, (2, 16))
    capped = MiniGPT(GPTConfig(**SMALL, logit_softcap=0.5))
    logits, loss = capped(x, x)
    assert logits.abs().max() <= 0.5 and torch.isfinite(loss)
    for options in (dict(qk_norm=True), dict(activation="relu2"), dict(rope=True)):
        torch.manual_seed(0)
        changed = MiniGPT(GPTConfig(**SMALL, **options))
        torch.manual_seed(0)
        plain = MiniGPT(GPTConfig(**SMALL))
        if "rope" not in options:  # the same parameters, a different function
            changed.load_state_dict(plain.state_dict())
        assert not torch.allclose(changed(x)[0], plain(x)[0]), options


def test_rope_scores_depend_on_relative_position_only():
    """The same query and key vectors at every position: after rotation, the score of
    positions (i, j) is a function of i - j alone (each diagonal is constant)."""
    model = MiniGPT(GPTConfig(**SMALL, rope=True))
    rotary = model.blocks[0].attn.rotary
    q = torch.randn(16).expand(1, 1, 12, 16)
    k = torch.randn(16).expand(1, 1, 12, 16)
    scores = rotary(q)[0, 0] @ rotary(k)[0, 0].T
    for offset in (-3, 0, 1, 5):
        diagonal = scores.diagonal(offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5), offset
    assert not torch.allclose(scores.diagonal(0)[0], scores.diagonal(1)[0])


def test_orthogonalize_is_torchs_newton_schulz():
    """The same quintic iteration as torch.optim.Muon (bitwise, in torch's bf16), and
    its singular values land in the iteration's band around 1."""
    torch.manual_seed(0)
    g = torch.randn(64, 32) @ torch.diag(torch.logspace(-1, 1, 32))
    s = torch.linalg.svdvals(orthogonalize(g))
    assert 0.5 < s.min() and s.max() < 1.5, s
    assert orthogonalize(g.T).shape == (32, 64)
    muon = pytest.importorskip("torch.optim._muon", reason="torch.optim.Muon: torch >= 2.9")
    theirs = muon._zeropower_via_newtonschulz(g, (3.4445, -4.775, 2.0315), 5, 1e-7)
    assert torch.equal(orthogonalize(g, dtype=torch.bfloat16), theirs.to(g.dtype))


def test_muon_steps_hidden_matrices_and_adamw_the_rest():
    torch.manual_seed(0)
    model = MiniGPT(GPTConfig(**SMALL, tie_embeddings=False))
    hidden = hidden_matrices(model, vocab_size=300)
    names = {n for n, p in model.named_parameters() if id(p) in hidden}
    assert names == {n for n, _ in model.named_parameters()
                     if n.startswith("blocks.") and n.endswith("weight") and "ln_" not in n}
    opt = muon_adamw(model, model.parameters(), lr=1e-3, muon_lr=0.02, weight_decay=0.1,
                     betas=(0.9, 0.99), vocab_size=300)
    x = torch.randint(0, 300, (4, 16))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(x, x)[1].backward()
    opt.step()
    for name, p in model.named_parameters():
        step = (p - before[name]).detach()
        if name in names:  # an orthogonalised update: ~ lr × sqrt(max(1, rows/cols)) per s.v.
            assert torch.linalg.svdvals(step).max().item() == pytest.approx(
                0.02 * math.sqrt(max(1.0, p.shape[0] / p.shape[1])), rel=0.6)
            assert "momentum_buffer" in opt.state[p]
        else:
            assert "exp_avg" in opt.state[p], name
    with pytest.raises(ValueError, match="2-D"):
        MuonAdamW([{"params": [nn.Parameter(torch.ones(3))], "use_muon": True}])


def test_the_config_builds_the_levers_and_the_optimizer():
    from phalanx.runtime.optim import make_optimizer

    cfg = build_config({"model": {"preset": "tiny", "rope": True, "qk_norm": True,
                                  "activation": "relu2", "tie_embeddings": False,
                                  "logit_softcap": 30.0},
                        "train": {"optimizer": "muon"}})
    model = build_model(cfg, 512)
    assert model.config.rope and model.config.qk_norm and not model.config.tie_embeddings
    assert model.lm_head.out_features == 512
    opt = make_optimizer(cfg, model, model.parameters(), torch.device("cpu"), 512)
    assert isinstance(opt, MuonAdamW)
    assert sum(g["use_muon"] for g in opt.param_groups) == 1


def test_wsd_holds_the_peak_then_decays_linearly():
    rates = [lr_at(s, lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=100, schedule="wsd",
                   decay_fraction=0.3) for s in range(100)]
    assert rates[9] == 1.0 and rates[10:70] == [1.0] * 60
    assert rates[70] == 1.0 and rates[99] == pytest.approx(0.1 + 0.9 / 30)
    assert all(a >= b for a, b in zip(rates[70:], rates[71:]))


def test_a_hidden_layer_as_wide_as_the_vocabulary_stays_muons():
    """bytes (V = 256) with n_embd 64: the MLP's c_fc has 256 outputs too; only the head
    (the last Linear with V outputs) goes to AdamW."""
    model = MiniGPT(GPTConfig(vocab_size=256, block_size=8, n_layer=1, n_head=2, n_embd=64,
                              tie_embeddings=False))
    hidden = hidden_matrices(model, vocab_size=256)
    names = {n for n, p in model.named_parameters() if id(p) in hidden}
    assert "blocks.0.mlp.c_fc.weight" in names and "lm_head.weight" not in names
    assert len(names) == 4


def test_the_report_charts_nats_per_byte_only_when_a_token_is_not_a_byte():
    from phalanx.report.charts import charts_svg

    bpe = [{"step": s, "loss": 5.0, "val_loss": 4.0, "val_nats_per_byte": 1.2}
           for s in (1, 2)]
    byte = [{**r, "val_nats_per_byte": r["val_loss"]} for r in bpe]
    titles = lambda rs: [t for t, _ in charts_svg(rs, [])]  # noqa: E731
    assert any(t.startswith("Validation loss per byte") for t in titles(bpe))
    assert not any(t.startswith("Validation loss per byte") for t in titles(byte))
