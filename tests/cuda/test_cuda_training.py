"""`phalanx train --preset gpt2-124m` on one GPU, as a user runs it: bf16, and fp16 with
its loss scaler, for a few hundred steps on the embedded corpus; the loss must fall."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from compare import scaler_stuck

pytestmark = pytest.mark.cuda

STEPS, LOG_EVERY = 300, 25
DROP_NATS = 1.0  # the last window's mean loss at least this far below the first's


@pytest.fixture(scope="module")
def token_cache(tmp_path_factory):
    """One tokenized corpus (GPT-2-sized BPE, trained once) for both runs."""
    return tmp_path_factory.mktemp("tokens")


def train(out: Path, cache: Path, precision: str, *extra: str) -> list[dict]:
    cmd = [sys.executable, "-m", "phalanx", "train", "--preset", "gpt2-124m",
           "--precision", precision, "--max-steps", str(STEPS), "--log-every", str(LOG_EVERY),
           "--eval-every", str(STEPS), "--eval-batches", "4", "--sample-tokens", "0",
           "--micro-batch-size", "8", "--nproc-per-node", "1", "--resume", "never",
           "--out", str(out), "--cache-dir", str(cache), *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


def check_falls(records: list[dict]) -> tuple[float, float]:
    losses = [r["loss"] for r in records]
    assert losses and all(math.isfinite(x) for x in losses), losses
    assert records[-1]["step"] == STEPS
    first, last = losses[0], losses[-1]
    assert last < first - DROP_NATS, f"loss {first:.3f} → {last:.3f}: did not fall by " \
                                     f"{DROP_NATS} nats in {STEPS} steps"
    return first, last


def test_bf16_trains_gpt2_124m(tmp_path, token_cache, figure):
    records = train(tmp_path / "bf16", token_cache, "bf16")
    first, last = check_falls(records)
    figure("train gpt2-124m bf16", first_loss=first, last_loss=last, steps=STEPS,
           tokens_per_s=records[-1]["tokens_per_s"], memory_mib=records[-1]["memory_mib"])


def test_fp16_trains_gpt2_124m_with_the_loss_scaler(tmp_path, token_cache, figure):
    out = tmp_path / "fp16"
    records = train(out, token_cache, "fp16")
    first, last = check_falls(records)
    scaler = find_key(out, "phalanx.scaler")  # the checkpoint's record of the scaler
    assert scaler is not None, "no loss-scaler state in the fp16 run's checkpoint"
    assert math.isfinite(scaler["scale"]) and scaler["scale"] >= 1.0, scaler
    stuck = scaler_stuck(scaler, 2.0 ** 16, STEPS)  # torch's initial scale
    assert stuck is None, stuck
    figure("train gpt2-124m fp16", first_loss=first, last_loss=last, steps=STEPS,
           tokens_per_s=records[-1]["tokens_per_s"], loss_scale=scaler["scale"])


def find_key(root: Path, key: str):
    """The value under `key` in any JSON file below `root` (checkpoint sidecars)."""
    for path in sorted(root.rglob("*.json")):
        try:
            found = _search(json.loads(path.read_text()), key)
        except (OSError, ValueError):
            continue
        if found is not None:
            return found
    return None


def _search(value, key: str):
    if isinstance(value, dict):
        if key in value:
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            found = _search(item, key)
            if found is not None:
                return found
    return None
