"""Helpers of the CUDA tier (tests/cuda): why it cannot run here, and how a test runs a
scenario of worker.py in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
FIGURES = "PHALANX_GPU_FIGURES"
SCENARIO_TIMEOUT_S = 300


def no_gpu_reason() -> str | None:
    """Why this tier cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return (f"needs a CUDA GPU: torch.cuda.is_available() is False (torch "
                f"{torch.__version__}, CUDA build {torch.version.cuda or 'none'})")
    if not torch.distributed.is_nccl_available():
        return "needs torch built with NCCL (torch.distributed.is_nccl_available() is False)"
    return None


def scenario(name: str, tmp_path: Path, env: dict[str, str] | None = None,
             **options) -> dict:
    """Run worker.py's `name` in a fresh process (one GPU, no launcher variables unless
    `env` sets them); its JSON result, or a failure with its output's tail."""
    out = tmp_path / f"{name}.json"
    clean = {k: v for k, v in os.environ.items()
             if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                          "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    proc = subprocess.run([sys.executable, str(HERE / "worker.py"), name, str(out),
                           json.dumps(options)], cwd=tmp_path, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"scenario {name} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                    f"{proc.stderr[-6000:]}")
    return json.loads(out.read_text())
