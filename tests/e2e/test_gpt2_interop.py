"""MiniGPT in GPT-2's shape ↔ transformers' GPT2LMHeadModel (issue 48, checkpoint/gpt2.py),
on 2 ranks under fsdp: a run exported with `--format gpt2` is read by `from_pretrained`
(tensors bit for bit, logits equal within float rounding), and a new run started from that
directory with `--init-from` (each rank reading its shards) holds the same weights bit for
bit (a step at lr 1e-30 moves no fp32 weight)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

GPT2_SHAPED = ["--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
               "--bias", "--no-rope", "--activation", "gelu", "--tie-embeddings",
               "--tokenizer", "bytes", "--micro-batch-size", "2", "--eval-every", "100",
               "--sample-tokens", "0", "--nproc-per-node", "2", "--strategy", "fsdp"]


def phalanx(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "phalanx", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def test_a_run_goes_out_as_gpt2_and_comes_back_in_bit_for_bit(tmp_path, corpus_file,
                                                              cache_dir):
    transformers = pytest.importorskip("transformers", reason="transformers is not "
                                       "installed (the `test` extra has it)")
    from safetensors.torch import load_file

    from phalanx.checkpoint.export import load_minigpt

    data = ["--data", str(corpus_file), "--cache-dir", str(cache_dir)]
    phalanx("train", *GPT2_SHAPED, *data, "--max-steps", "2", "--out", "first", cwd=tmp_path)
    said = phalanx("export", "first", "--format", "gpt2", "--out", "hf", cwd=tmp_path)
    assert "hf/model.safetensors" in said
    ours = load_minigpt(tmp_path / "first")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    theirs = dict(hf.named_parameters())
    for name, value in ours.state_dict().items():
        if name == "lm_head.weight":
            continue
        twin = "transformer." + name.replace("blocks.", "h.")
        conv = name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        assert torch.equal(theirs[twin].detach(), value.t() if conv else value), name
    idx = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, _ = ours.eval()(idx)
        torch.testing.assert_close(hf(idx).logits, logits, rtol=1e-5, atol=1e-5)
    said = phalanx("train", *GPT2_SHAPED, *data, "--init-from", "hf", "--optimizer", "adamw",
                   "--lr", "1e-30", "--min-lr", "0", "--max-steps", "1", "--out", "second",
                   cwd=tmp_path)
    assert "started from the weights of hf" in said
    assert "activation_function" not in said  # its config.json says MiniGPT's exact GELU
    first = load_file(str(tmp_path / "first" / "model.safetensors"))
    second = load_file(str(tmp_path / "second" / "model.safetensors"))
    assert sorted(first) == sorted(second)
    assert all(torch.equal(second[k], v) for k, v in first.items())
