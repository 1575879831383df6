"""`--model pkg.module:factory` for `phalanx train`, without a process group: the factory's
call, the adapter to `logits, loss = model(x, y)` in each form the contract allows, the
one-line errors, the seeded build, export's names and the resume check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file
from torch.nn import functional as F

from phalanx.checkpoint.export import _user_class, export_weights
from phalanx.config.sections import build_config
from phalanx.errors import UserError
from phalanx.models import build_model
from phalanx.models.adapter import Sampler, adapt, user_class
from phalanx.models.user import check_user_model, factory_keywords, make_model
from phalanx.train.changes import check_compatible

sys.path.insert(0, str(Path(__file__).parents[1]))
import user_lm  # noqa: E402

V, T = 256, 8
X = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
Y = torch.roll(X, -1, 1)


def cfg_for(factory: str, **train):
    return build_config({"model": {"factory": factory, "block_size": T}, "train": train})


def expected_loss(logits: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), Y.flatten())


class Tuple(user_lm.ConvLM):
    def forward(self, idx):  # type: ignore[override]
        return super().forward(idx), {"aux": 1}


class LossOnly(user_lm.ConvLM):
    def forward(self, idx, targets=None):  # type: ignore[override]
        logits = super().forward(idx)
        return logits if targets is None else F.cross_entropy(logits.flatten(0, 1),
                                                              targets.flatten())


class LossObject(user_lm.ConvLM):
    def forward(self, idx, targets=None):  # type: ignore[override]
        logits = super().forward(idx)
        return user_lm.Output(logits, None if targets is None else
                              F.cross_entropy(logits.flatten(0, 1), targets.flatten()))


@pytest.mark.parametrize("cls", [user_lm.ConvLM, Tuple, user_lm.HFStyle])
def test_a_forward_that_returns_logits_gets_phalanx_cross_entropy(cls):
    torch.manual_seed(0)
    plain = cls(V)
    own = plain(X)
    own = own.logits if hasattr(own, "logits") else own[0] if isinstance(own, tuple) else own
    model = adapt(plain, "t:f", V)
    logits, loss = model(X, Y)
    assert torch.equal(logits, own)
    assert torch.equal(loss, expected_loss(own))  # targets as given: no second shift
    assert model(X)[1] is None and torch.equal(model(X)[0], own)


@pytest.mark.parametrize("cls", [user_lm.WithTargets, LossOnly, LossObject])
def test_a_forward_that_takes_targets_returns_the_loss_phalanx_uses(cls):
    torch.manual_seed(0)
    model = adapt(cls(V), "t:f", V)
    logits, loss = model(X, Y)
    assert loss.dim() == 0
    reference = user_lm.ConvLM.forward(model, X)
    assert torch.allclose(loss, expected_loss(reference))
    assert logits is None if cls is LossOnly else torch.equal(logits, reference)
    loss.backward()
    assert model.embed.weight.grad is not None


def test_labels_are_never_passed_and_other_calls_reach_the_users_forward():
    model = adapt(user_lm.HFStyle(V), "t:f", V)
    out = model(input_ids=X, labels=X)  # as transformers' generate/trainer call it
    assert isinstance(out, user_lm.Output) and out.loss is not None


def test_the_adapted_model_keeps_its_names_class_and_state():
    torch.manual_seed(0)
    plain = user_lm.ConvLM(V)
    names, state = list(plain.state_dict()), {k: v.clone() for k, v in plain.state_dict().items()}
    model = adapt(plain, "t:f", V)
    assert model is plain and isinstance(model, user_lm.ConvLM)
    assert list(model.state_dict()) == names and user_class(model) is user_lm.ConvLM
    assert _user_class(model) is user_lm.ConvLM
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert adapt(model, "t:f", V) is model and type(adapt(model, "t:f", V)) is type(model)
    fresh = user_lm.ConvLM(V)
    fresh.load_state_dict(model.state_dict())  # the user's class loads what Phalanx saves


def test_wrong_logits_are_one_user_error():
    model = adapt(user_lm.ConvLM(V + 1), "pkg.m:f", V)
    with pytest.raises(UserError, match=r"`--model pkg.m:f`: for token ids of shape \(2, 8\) "
                                        r"its forward returned logits of shape \(2, 8, 257\); "
                                        r"expected \(B, T, 256\)"):
        model(X, Y)

    class Last(user_lm.ConvLM):
        def forward(self, idx):  # type: ignore[override]
            return super().forward(idx)[:, -1]  # only the last position

    with pytest.raises(UserError, match=r"logits of shape \(2, 256\)"):
        adapt(Last(V), "pkg.m:f", V)(X, Y)

    class Words(user_lm.ConvLM):
        def forward(self, idx, targets=None):  # type: ignore[override]
            return "no loss"

    with pytest.raises(UserError, match="returned a str; with `targets` it must return the "
                                        "loss"):
        adapt(Words(V), "pkg.m:f", V)(X, Y)


def test_the_factory_gets_the_keywords_its_signature_accepts():
    def none():
        pass

    def vocab(vocab_size):
        pass

    def both(*, block_size=1, vocab_size=2):
        pass

    def anything(**kwargs):
        pass

    given = {"vocab_size": 300, "block_size": 16}
    assert factory_keywords(none, **given) == {}
    assert factory_keywords(vocab, **given) == {"vocab_size": 300}
    assert factory_keywords(both, **given) == given
    assert factory_keywords(anything, **given) == given
    assert factory_keywords(anything, vocab_size=300, block_size=None) == {"vocab_size": 300}


def test_build_model_builds_the_factory_identically_whatever_the_callers_rng(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    cfg = cfg_for("user_lm:conv_lm", seed=7)
    torch.manual_seed(1)
    a = build_model(cfg, V)
    torch.manual_seed(2)
    b = build_model(cfg, V)
    assert type(a).__name__ == "ConvLM" and isinstance(a, user_lm.ConvLM)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                  b.state_dict().values()))
    c = build_model(cfg_for("user_lm:conv_lm", seed=8), V)
    assert not torch.equal(a.embed.weight, c.embed.weight)  # the seed is the config's


def test_the_check_before_launch_names_each_failure(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    check_user_model("user_lm:conv_lm", V, T)  # fine, on the meta device
    check_user_model("user_lm:with_targets", V, T)
    for spec, needle in (("user_lm:wrong_vocab", "expected (B, T, 256)"),
                         ("user_lm:raises", "the factory raised ValueError: no weights here "
                                            "(called as `raises(vocab_size=256)`)"),
                         ("user_lm:returns_int", "returned int; expected a torch.nn.Module"),
                         ("user_lm:nothing", "`user_lm` has nothing named `nothing`"),
                         ("no_such_module_here:f", "cannot load it (ModuleNotFoundError")):
        with pytest.raises(UserError) as info:
            check_user_model(spec, V, T)
        assert needle in str(info.value) and "\n" not in str(info.value), info.value


@pytest.mark.parametrize("spec, needle", [
    ("user_lm:no_parameters", "has no parameter"),
    ("user_lm:buffers_only", "has no parameter (only 1 buffer)"),
    ("user_lm:frozen", "has 23 parameters and none requires grad"),
    ("user_lm:int_logits", "logits of dtype torch.int64; expected floating-point"),
    ("user_lm:complex_logits", "logits of dtype torch.complex64; expected floating-point"),
])
def test_a_model_that_cannot_train_is_refused_before_launch(monkeypatch, spec, needle):
    """Issue 39: these passed the check and crashed every rank with torch's traceback."""
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    with pytest.raises(UserError) as info:
        check_user_model(spec, V, T)
    assert needle in str(info.value) and "\n" not in str(info.value), info.value


def test_a_forward_that_cannot_run_on_meta_is_checked_on_the_cpu(monkeypatch, tmp_path):
    (tmp_path / "itemlm.py").write_text(
        "import torch, user_lm\n"
        "class M(user_lm.ConvLM):\n"
        "    def forward(self, idx):\n"
        "        assert idx.max().item() >= 0  # no .item() on the meta device\n"
        "        return super().forward(idx)[..., :-1]\n"
        "def f(vocab_size):\n    return M(vocab_size)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    with pytest.raises(UserError, match=r"logits of shape \(1, 8, 255\)"):
        check_user_model("itemlm:f", V, T)


def test_the_model_flag_is_checked_with_the_config():
    with pytest.raises(UserError, match="`--model pkg`: expected `package.module:factory`"):
        build_config({"model": {"factory": "pkg"}})
    with pytest.raises(UserError, match="expected `package.module:factory`"):
        build_config({"model": {"factory": "a b:c"}})
    assert build_config({"model": {"factory": "a.b:c"}}).model.factory == "a.b:c"


def test_export_writes_the_users_names_and_the_factory(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    cfg = cfg_for("user_lm:conv_lm")
    model = build_model(cfg, V)
    path = export_weights(model, tmp_path, {"phalanx": cfg.to_dict()})
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["factory"] == "user_lm:conv_lm" and config["class"] == "user_lm.ConvLM"
    assert config["factory_kwargs"] == {"vocab_size": V, "block_size": T}
    fresh = user_lm.conv_lm(**config["factory_kwargs"])
    fresh.load_state_dict(load_file(str(path)))  # strict: every name, the tied head too
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                  model.state_dict().values()))


def test_resuming_with_another_factory_is_refused_naming_the_flag():
    meta = {"config": cfg_for("a.b:one").to_dict()}
    with pytest.raises(UserError, match=r"another model shape: --model a.b:one → a.b:two"):
        check_compatible(cfg_for("a.b:two"), meta, Path("ckpt"))
    with pytest.raises(UserError, match=r"--model a.b:one → \(none: MiniGPT\)"):
        check_compatible(build_config({"model": {"block_size": T}}), meta, Path("ckpt"))
    relaxed = cfg_for("a.b:one").to_dict()
    relaxed["model"]["n_layer"] = 9  # MiniGPT's flags do not shape a factory's model
    assert check_compatible(cfg_for("a.b:one"), {"config": relaxed}, Path("ckpt")) == []


def test_the_sampler_generates_from_the_forward_alone():
    torch.manual_seed(0)
    model = adapt(user_lm.ConvLM(V), "t:f", V)
    sampler = Sampler(model, block_size=T).eval()
    out = sampler.generate(X[:1, :3], 12, generator=torch.Generator().manual_seed(1))
    assert out.shape == (1, 15) and torch.equal(out[:, :3], X[:1, :3])
    assert not model.training


def test_a_factory_without_parameters_is_called_without_keywords(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    with pytest.raises(UserError, match="returned int"):  # called: no TypeError for keywords
        make_model("user_lm:returns_int", vocab_size=V, block_size=T)
    model, example = make_model("user_lm:hf_style", vocab_size=V, block_size=T)
    assert isinstance(model, nn.Module) and example is None and model.embed.num_embeddings == V


def test_plan_traces_a_train_factory_on_token_ids(monkeypatch):
    from phalanx.plan.user_model import user_facts

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1]))
    facts = user_facts("user_lm:conv_lm", (4, T))  # the module alone, as train takes it
    model = user_lm.conv_lm(V, T)
    assert sum(torch.Size(s).numel() for s in facts.param_shapes) == \
        sum(p.numel() for p in model.parameters())  # the tied head once
    assert facts.n_blocks == 2  # the ModuleList's two blocks
    assert facts.logits == 4 * T * V * 4  # the (4, T, 256) fp32 logits were traced
