"""`phalanx train` end to end: 2 ranks through the elastic agent, and under torchrun."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from phalanx.checkpoint.export import load_minigpt
from phalanx.config.sections import build_config
from phalanx.data.corpus import prepare
from phalanx.report.sink import tensorboard_available as tensorboard_installed
from phalanx.train.finish import sample_prompt

sys.path.insert(0, str(Path(__file__).parents[1]))
from readme_blocks import wrote as readme_wrote  # noqa: E402

SMALL = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
         "--micro-batch-size", "4", "--max-steps", "6", "--eval-every", "3", "--log-every", "2",
         "--sample-tokens", "20"]


def test_phalanx_train_two_ranks_writes_every_output(tmp_path, corpus_file, cache_dir):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", "train", *SMALL, "--nproc-per-node", "2",
         "--data", str(corpus_file), "--cache-dir", str(cache_dir), "--out", str(out)],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rank(s) · gloo on cpu · strategy ddp" in proc.stdout
    assert proc.stdout.count("--- sample ---") == 1  # rank 0 talks, rank 1 is quiet
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3, 4, 6]
    for r in records:
        if r["step"] % 2 == 0:
            assert {"loss", "lr", "tokens_per_s"} <= r.keys()
    assert "val_loss" in records[1] and "val_loss" in records[-1]
    config = json.loads((out / "config.json").read_text())
    assert config["n_embd"] == 32 and config["vocab_size"] == 256
    weights = load_file(str(out / "model.safetensors"))  # plain safetensors, no Phalanx
    assert weights["wte.weight"].shape == (256, 32) and not config["tie_word_embeddings"]
    assert weights["lm_head.weight"].shape == (256, 32)  # the default: an untied head
    model = load_minigpt(out)
    assert torch.equal(model.lm_head.weight, weights["lm_head.weight"])
    assert (out / "loss.png").stat().st_size > 1000
    prompt = sample_prompt(build_config({"data": {"path": str(corpus_file)}}),
                           prepare(str(corpus_file), str(cache_dir), 0.05))
    assert any(line.startswith(prompt) for line in corpus_file.read_text().splitlines())
    assert (out / "sample.txt").read_text(encoding="utf-8").startswith(prompt)  # --data's text
    wrote = next(line for line in proc.stdout.splitlines() if line.startswith("wrote: "))
    names = ["model.safetensors", "config.json", "metrics.jsonl", "sample.txt", "loss.png",
             "report.html", *(["tb/"] if tensorboard_installed() else []), "logs/"]
    assert wrote == "wrote: " + ", ".join(f"{out}/{name}" for name in names), wrote
    # the README's list: a default run's (BPE: tokenizer.json), as a plain install writes it
    # (no tb/ without TensorBoard)
    readme = [n for n in names if n != "tb/"]
    assert readme_wrote() == readme[:3] + ["tokenizer.json"] + readme[3:], readme_wrote()
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.safetensors", "config.json", "metrics.jsonl", "report.html"):
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~umask, name  # as the umask says


def test_a_large_model_on_cpu_says_how_slow_up_front(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "phalanx", "train", "--preset", "gpt2-124m",
                             "--micro-batch-size", "16", "--max-steps", "400", "--out", str(tmp_path / "big")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()  # before any worker starts
    finally:
        proc.kill()
        proc.communicate()
    # GPT-2 small with the preset's 50,257-token BPE: 14.0 TFLOP (86 M parameters' 10.2
    # with bytes)
    assert re.match(r"phalanx: note: MiniGPT 12L × 768d, block 1024, on CPU: at least [\d.]+ "
                    r"(s|min) per step \(14\.0 TFLOP per step per rank; this machine's matmuls "
                    r"run at \d+ GFLOP/s with \d+ thread\(s\)\), so 400 steps take at least ",
                    first), first


def test_under_torchrun_phalanx_is_just_the_worker(tmp_path, corpus_file, cache_dir):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "phalanx", "train", *SMALL, "--data", str(corpus_file), "--cache-dir",
           str(cache_dir), "--out", str(out), "--sample-tokens", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rank(s) · gloo on cpu" in proc.stdout
    assert (out / "model.safetensors").exists()
    assert torch.isfinite(torch.tensor(
        json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["val_loss"]))
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)  # rank 1 too
    assert again.returncode == 0 and again.stdout.count("is already complete") == 1, \
        again.stdout + again.stderr
