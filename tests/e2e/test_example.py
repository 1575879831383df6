"""The example script runs as a plain script and under torchrun, unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "train_own_model.py")


def test_example_as_a_plain_script(tmp_path):
    out = tmp_path / "w.pt"
    proc = subprocess.run([sys.executable, EXAMPLE, "--epochs", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "epoch 2/2" in proc.stdout and "(1 rank(s), 128 batches/rank/epoch)" in proc.stdout
    assert set(torch.load(out, weights_only=True)) == {"0.weight", "0.bias", "2.weight",
                                                        "2.bias", "4.weight", "4.bias"}


def test_example_under_torchrun(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         EXAMPLE, "--epochs", "3"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = [l for l in proc.stdout.splitlines() if l.startswith("epoch")]
    assert len(lines) == 3  # rank 0 only
    assert "(2 rank(s), 64 batches/rank/epoch)" in lines[0]
    assert float(lines[-1].split("val mse")[1].split()[0]) < 0.5
