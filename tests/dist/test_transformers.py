"""Hugging Face `transformers` models (GPT-2 with tied embeddings, Llama), built from tiny
configs, on Phalanx's public API at 2 gloo ranks (tests/dist/transformers_scenarios.py is
the worker): every strategy trains them alike, FSDP finds their blocks by itself,
checkpoints resume exactly, exports load with `from_pretrained`, bf16 trains.

Tolerance: fp32, the same samples, AdamW at lr 1e-3; the strategies sum gradients in
other orders (and one process sums the global batch at once). The largest weight
difference seen after 4 steps is ~2e-6 (GPT-2's key bias, whose gradient is rounding
noise: see the worker's LR); TOL allows 5x that.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import phalanx
from phalanx.checkpoint.export import PLAIN_CONFIG, export_pretrained
from phalanx.errors import UserError
from phalanx.launch.agent import launch_workers
from phalanx.strategies.blocks import find_blocks

HERE = Path(__file__).parent
EXAMPLE = HERE.parent.parent / "examples" / "train_transformers.py"
TOL = dict(rtol=0, atol=1e-5)
MODELS = ["gpt2", "llama"]


@pytest.fixture(scope="module")
def scen():
    """The worker module (it imports transformers: skipped, saying so, without it)."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (the `test` extra has it: "
        "pip install -c constraints.txt -e '.[test]')")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    # (tests/dist is on sys.path: conftest.py)
    import transformers_scenarios

    return transformers_scenarios


@pytest.fixture(scope="module")
def out(scen, tmp_path_factory):
    where = tmp_path_factory.mktemp("transformers")
    launch_workers([scen.__file__, str(where)], 2, threads=1)
    return where


def load(out: Path, name: str) -> dict:
    return torch.load(out / f"{name}.pt", weights_only=True)


def assert_close(found: dict, expected: dict, what: str) -> None:
    assert found.keys() == expected.keys(), what
    for key in found:
        torch.testing.assert_close(found[key], expected[key], **TOL, msg=f"{what}: {key}")


def assert_bitwise(found: dict, expected: dict, what: str) -> None:
    assert found.keys() == expected.keys(), what
    differ = [k for k in found if not torch.equal(found[k], expected[k])]
    assert not differ, f"{what}: {differ}"


@pytest.mark.parametrize("name", MODELS)
def test_every_strategy_equals_ddp_and_one_process(out, name):
    reference, ddp = load(out, f"{name}-reference"), load(out, f"{name}-ddp")
    assert_close(ddp["state"], reference["state"], f"{name}: ddp vs one process")
    assert ddp["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    for label in ("zero", "fsdp"):
        found = load(out, f"{name}-{label}")
        assert_close(found["state"], ddp["state"], f"{name}: {label} vs ddp")
        assert found["losses"] == pytest.approx(ddp["losses"], rel=1e-5), label
        torch.testing.assert_close(found["logits"], ddp["logits"], **TOL)
    assert ddp["losses"][-1] != ddp["losses"][0]  # it trained


@pytest.mark.parametrize("name, blocks, kind", [
    ("gpt2", ("transformer.h.0", "transformer.h.1"), "GPT2Block"),
    ("llama", ("model.layers.0", "model.layers.1"), "LlamaDecoderLayer")])
def test_fsdp_finds_the_blocks_unnamed(scen, out, name, blocks, kind):
    model = scen.build(name)
    names = {id(m): n for n, m in model.named_modules()}
    assert tuple(names[id(b)] for b in find_blocks(model)) == blocks
    found = load(out, f"{name}-fsdp")
    assert found["sharded"] == ["", *blocks]  # one FSDP unit per block, then the root
    assert found["said"] == (f"phalanx: fsdp: sharding 2 blocks `{blocks[0]}`…`{blocks[1]}` "
                             f"({kind}), then the root\n")


def test_a_model_without_repeated_blocks_is_one_unit_and_said(scen, out):
    assert find_blocks(scen.GPT2LMHeadModel(scen.gpt2_config(n_layer=1))) == []
    found = load(out, "no-blocks")
    assert found["sharded"] == [""]
    said = found["said"].splitlines()
    assert len(said) == 1, said
    assert said[0].startswith("phalanx: fsdp: no repeated blocks found in GPT2LMHeadModel: "
                              "sharding it as one unit"), said
    assert all(math.isfinite(v) for v in found["losses"])


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("label", ["ddp", "zero", "fsdp"])
def test_checkpoint_resumes_bit_exactly_under_the_same_strategy(out, name, label):
    straight, resumed = load(out, f"{name}-{label}"), load(out, f"{name}-{label}-to-{label}")
    assert_bitwise(resumed["state"], straight["state"], f"{name} {label}")
    assert resumed["losses"] == straight["losses"][2:]


@pytest.mark.parametrize("name", MODELS)
def test_ddp_checkpoint_resumes_under_fsdp(out, name):
    resumed = load(out, f"{name}-ddp-to-fsdp")
    for label in ("ddp", "fsdp"):
        assert_close(resumed["state"], load(out, f"{name}-{label}")["state"],
                     f"{name} ddp→fsdp vs {label}")


def test_fsdp_checkpoint_resumes_in_one_process(scen, out):
    """2 ranks' FSDP shards → 1 process (single): another world size and strategy."""
    with phalanx.init(seed=0, threads=1) as run:
        assert run.world_size == 1
        model, opt, _ = scen.setup(run, "gpt2", seed=123)
        run.load(out / "ckpt-gpt2-fsdp" / f"step-{scen.SAVE_AT:08d}", model, opt)
        losses = scen.train(run, model, opt, scen.SAVE_AT, scen.STEPS)
        state = {k: v.clone() for k, v in run.full_state_dict(model).items()}
    straight = load(out, "gpt2-fsdp")
    assert_close(state, straight["state"], "fsdp (2 ranks) → 1 process")
    assert losses == pytest.approx(straight["losses"][2:], rel=1e-5)


@pytest.mark.parametrize("label", ["ddp", "fsdp"])
def test_tied_embeddings_survive_full_state_dict(scen, out, label):
    found = load(out, f"gpt2-{label}")
    state = found["state"]
    assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    fresh = scen.GPT2LMHeadModel(scen.gpt2_config())
    fresh.load_state_dict(state)  # strict: every key, no extra
    assert fresh.lm_head.weight is fresh.transformer.wte.weight
    with torch.no_grad():
        torch.testing.assert_close(fresh(input_ids=scen.PROBE).logits, found["logits"], **TOL)


@pytest.mark.parametrize("name, label", [("gpt2", "fsdp"), ("llama", "fsdp"), ("gpt2", "ddp")])
def test_export_loads_with_from_pretrained(scen, out, name, label):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    where, found = out / f"export-{name}-{label}", load(out, f"{name}-{label}")
    assert found["returned"] == [str(where), None]  # the path on rank 0, None elsewhere
    loaded = AutoModelForCausalLM.from_pretrained(where)
    assert type(loaded) is scen.MODELS[name][0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=scen.PROBE).logits, found["logits"], **TOL)
    stored = {k: v for f in sorted(where.glob("*.safetensors")) for k, v in load_file(f).items()}
    # fsdp: written shard by shard in Hugging Face's layout (an index beside the files),
    # not gathered on rank 0 (checkpoint/export_sharded.py)
    assert (where / "model.safetensors.index.json").is_file() == (label == "fsdp")
    if name == "gpt2":
        assert loaded.lm_head.weight is loaded.transformer.wte.weight
        assert "lm_head.weight" not in stored  # the tied weight stored once
    assert len(stored) == len({id(p) for p in loaded.parameters()})  # each once


def test_export_failing_on_rank_0_raises_on_every_rank(out):
    said = [(out / f"occupied-rank{r}.txt").read_text() for r in (0, 1)]
    assert "holds files an export does not write (notes.txt)" in said[0], said
    assert said[1].startswith("rank 0 could not export the model to `"), said
    assert "holds files an export does not write (notes.txt)" in said[1], said


@pytest.mark.parametrize("name, label", [("gpt2", "ddp"), ("gpt2", "fsdp"), ("llama", "fsdp")])
def test_bf16_autocast_trains(out, name, label):
    losses = load(out, f"bf16-{name}-{label}")["losses"]
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < 0.9 * losses[0], losses  # the same batch six times: it learns it


class Tied(nn.Module):
    """A plain module whose output layer shares the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.full((4,), 2.0))

    def forward(self, x):
        return self.head(self.embed(x) * self.scale)


def test_export_of_a_plain_module(tmp_path):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    model, where = Tied(), tmp_path / "export"
    assert export_pretrained(model, model.state_dict(), where) == where
    stored = load_file(str(where / "model.safetensors"))
    assert sorted(stored) == ["embed.weight", "scale"]  # the tied weight once
    meta = json.loads((where / PLAIN_CONFIG).read_text())
    assert meta["class"].endswith(".Tied") and meta["tied"] == {"head.weight": "embed.weight"}
    fresh = Tied()
    missing, unexpected = fresh.load_state_dict(stored, strict=False)
    assert missing == ["head.weight"] and unexpected == []
    x = torch.arange(10)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
    # again into the same place: the previous export is replaced whole
    (where / "model-00001-of-00002.safetensors").write_text("a stale shard")
    export_pretrained(model, model.state_dict(), where)
    assert sorted(p.name for p in where.iterdir()) == ["model.safetensors", PLAIN_CONFIG]


def test_export_refuses_a_place_that_is_not_an_export(tmp_path):
    model = Tied()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "mine" / "config.json").write_text("{}")  # e.g. a run directory
    (tmp_path / "mine" / "checkpoints").mkdir()
    with pytest.raises(UserError, match=r"does not write \(checkpoints, notes.txt\)"):
        export_pretrained(model, model.state_dict(), tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file; an export is a directory"):
        export_pretrained(model, model.state_dict(), tmp_path / "file")
    wrong = {**model.state_dict(), "head.weight": torch.zeros(10, 4)}
    with pytest.raises(ValueError, match="one \\(tied\\) parameter"):
        export_pretrained(model, wrong, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_example_trains_resumes_and_exports(scen, tmp_path):
    """examples/train_transformers.py, a few steps under python, then resumed."""
    from transformers import AutoModelForCausalLM

    def example(steps: int) -> str:
        args = ["--steps", str(steps), "--save-every", "2", "--log-every", "1",
                "--batch-size", "2", "--block", "32", "--out", str(tmp_path)]
        done = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    first = example(2)
    assert "step 2/2 | loss" in first and "resumed" not in first
    second = example(4)
    assert f"resumed from {tmp_path / 'checkpoints' / 'step-00000002'} (step 2)" in second
    assert "step 3/4" in second and "step 1/" not in second
    assert f"exported: {tmp_path / 'model'}" in second
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert loaded.lm_head.weight is loaded.transformer.wte.weight


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_phalanx_export_rebuilds_a_two_rank_fsdp_checkpoint(scen, out, tmp_path, name):
    """The verb on a script's checkpoint: the model rebuilt from its recorded class and
    config, the FSDP shards gathered into it, written for `from_pretrained`."""
    from transformers import AutoModelForCausalLM

    ckpt = out / f"ckpt-{name}-fsdp" / f"step-{scen.SAVE_AT:08d}"
    done = subprocess.run([sys.executable, "-m", "phalanx", "export", str(ckpt), "--out",
                           str(tmp_path / "hf")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(loaded) is scen.MODELS[name][0]
    with phalanx.init(seed=0, threads=1) as run:
        model, opt, _ = scen.setup(run, name, seed=123)
        run.load(ckpt, model, opt)
        with torch.no_grad():
            want = model(input_ids=scen.PROBE).logits
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=scen.PROBE).logits, want, **TOL)
