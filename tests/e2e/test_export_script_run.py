"""`phalanx export` of a script's run: a transformers model saved by `run.save` is rebuilt
from the checkpoint alone and written as the directory `from_pretrained` reads; a model of
no library Phalanx knows is refused in one line that names `run.export`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import phalanx

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (the `test` extra has it)")


def _export(source, out, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", "export", str(source), "--out",
                           str(out), *more], capture_output=True, text=True, timeout=120)


def test_a_scripts_transformers_checkpoint_exports_for_from_pretrained(tmp_path):
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    with phalanx.init(seed=0, threads=1, out=tmp_path / "run") as run:
        torch.manual_seed(0)
        model, opt = run.setup(transformers.GPT2LMHeadModel(config),
                               lambda p: torch.optim.AdamW(p, lr=1e-2))
        model(input_ids=x, labels=x).loss.backward()
        run.step(opt)  # the weights differ from a fresh model's
        run.save(run.out / "checkpoints", 1, model, opt)
        model.eval()  # GPT-2's dropout
        with torch.no_grad():
            want = model(input_ids=x).logits
    done = _export(tmp_path / "run", tmp_path / "hf")
    assert done.returncode == 0, done.stderr
    assert "GPT2LMHeadModel" in done.stdout and "from_pretrained reads it" in done.stdout
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert type(back).__name__ == "GPT2LMHeadModel"
    assert back.lm_head.weight.data_ptr() == back.transformer.wte.weight.data_ptr()  # tied
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=x).logits, want, rtol=0, atol=1e-5)
    again = _export(tmp_path / "run", tmp_path / "hf")
    assert again.returncode == 2 and "Pass `--force`" in again.stderr
    gpt2 = _export(tmp_path / "run", tmp_path / "other", "--format", "gpt2")
    assert gpt2.returncode == 2 and "holds a transformers model, which is exported as its " \
        "own from_pretrained directory: leave out `--format`" in gpt2.stderr


def test_a_scripts_own_module_is_refused_naming_run_export(tmp_path):
    with phalanx.init(seed=0, threads=1) as run:
        model, opt = run.setup(nn.Linear(3, 1), lambda p: torch.optim.SGD(p, lr=0.1))
        run.save(tmp_path / "checkpoints", 1, model, opt)
    done = _export(tmp_path, tmp_path / "out.safetensors")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "run.export(model, DIR)" in line and "cannot rebuild" in line
