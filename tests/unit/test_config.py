"""Config: defaults, presets, precedence, and messages that name the flags."""

from __future__ import annotations

import argparse

import pytest

from phalanx.config.flags import add_config_flags, load_toml, resolve
from phalanx.config.sections import PRESETS, build_config
from phalanx.errors import UserError


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    return resolve(parser.parse_args(list(argv)))


def test_defaults_are_the_tiny_preset():
    cfg = parse()
    for key, value in PRESETS["tiny"].items():
        assert getattr(cfg.model, key) == value
    assert cfg.train.precision == "fp32" and cfg.dist.strategy is None


def test_cli_overrides_toml_and_toml_overrides_preset(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[model]\npreset = 'small'\nn_layer = 3\n[train]\nlr = 0.01\nmax_steps = 7\n")
    cfg = parse("--config", str(toml), "--max-steps", "9")
    assert cfg.model.n_embd == PRESETS["small"]["n_embd"]  # from preset
    assert cfg.model.n_layer == 3  # TOML beats preset
    assert cfg.train.lr == 0.01 and cfg.train.max_steps == 9  # CLI beats TOML


@pytest.mark.parametrize("argv, needle", [
    (["--n-embd", "130", "--n-head", "4"], "`--n-embd` (130) must be divisible by `--n-head` (4)"),
    (["--micro-batch-size", "0"], "`--micro-batch-size` must be a positive number, got 0"),
    (["--nproc-per-node", "0"], "`--nproc-per-node` must be a positive number, got 0"),
    (["--grad-accum", "-1"], "`--grad-accum` must be a positive number"),
    (["--dropout", "1.5"], "`--dropout` must be in [0, 1)"),
    (["--lr", "1e-4", "--min-lr", "1e-3"], "`--min-lr` (0.001) must not exceed `--lr`"),
])
def test_invalid_values_name_the_flag(argv, needle):
    with pytest.raises(UserError) as err:
        parse(*argv)
    assert needle in str(err.value)


def test_unknown_toml_key_suggests_the_right_one(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[model]\nn_layers = 3\n")
    with pytest.raises(UserError, match=r"unknown key `n_layers` in `\[model\]`.*did you mean `n_layer`"):
        load_toml(str(toml))


def test_unknown_section_and_wrong_type_and_bad_choice(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[optim]\nlr = 1\n")
    with pytest.raises(UserError, match=r"unknown section `\[optim\]`"):
        load_toml(str(toml))
    toml.write_text("[train]\nmax_steps = 'ten'\n")
    with pytest.raises(UserError, match=r"`train.max_steps` .* must be int, got 'ten'"):
        load_toml(str(toml))
    toml.write_text("[train]\nprecision = 'fp8'\n")
    with pytest.raises(UserError, match=r"expected one of: fp32, bf16, fp16"):
        load_toml(str(toml))


def test_malformed_toml_is_a_user_error(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[model\nn_layer = \n")
    with pytest.raises(UserError, match="is not valid TOML"):
        load_toml(str(toml))


def test_unknown_preset():
    with pytest.raises(UserError, match="unknown model preset `huge`"):
        build_config({"model": {"preset": "huge"}})
