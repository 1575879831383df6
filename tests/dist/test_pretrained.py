"""Hugging Face checkpoints in (`run.load_pretrained`, checkpoint/pretrained.py): a
`save_pretrained` directory loaded into a model set up under ddp and fsdp on 2 gloo ranks
(tests/dist/pretrained_scenarios.py) equals `from_pretrained` in one process: the weights
bit for bit (GPT-2's tied head through its twin), the logits to float rounding (the
ranks run 1 thread, this process its own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from phalanx.errors import UserError
from phalanx.launch.agent import launch_workers

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    pytest.importorskip("transformers", reason="transformers is not installed (the `test` "
                        "extra has it: pip install -c constraints.txt -e '.[test]')")
    from transformers_scenarios import MODELS

    where = tmp_path_factory.mktemp("pretrained")
    for name, (cls, config) in MODELS.items():
        torch.manual_seed(5)
        cls(config()).save_pretrained(where / name)
    launch_workers([str(HERE / "pretrained_scenarios.py"), str(where)], 2, threads=1)
    return where


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_save_pretrained_directory_loads_into_every_strategy(out, name, strategy):
    from transformers_scenarios import MODELS, PROBE

    cls = MODELS[name][0]
    one = cls.from_pretrained(out / name).eval()
    found = torch.load(out / f"{name}-{strategy}.pt", weights_only=True)
    expected = one.state_dict()
    assert sorted(found["state"]) == sorted(expected)
    assert all(torch.equal(found["state"][k], v) for k, v in expected.items())
    with torch.no_grad():
        logits = one(input_ids=PROBE).logits
    assert torch.allclose(found["logits"], logits, rtol=0, atol=1e-5)


def test_a_directory_of_another_model_is_refused_in_one_line(out):
    import phalanx
    from transformers_scenarios import MODELS

    with phalanx.init(seed=0, threads=1) as run:
        model = run.setup(MODELS["llama"][0](MODELS["llama"][1]()))
        with pytest.raises(UserError, match=r"has no tensor `model\.embed_tokens\.weight` "
                                             r"\(and \d+ more\)") as e:
            run.load_pretrained(model, out / "gpt2")
        assert "\n" not in str(e.value)
        with pytest.raises(UserError, match="not a Hugging Face model directory"):
            run.load_pretrained(model, out)
