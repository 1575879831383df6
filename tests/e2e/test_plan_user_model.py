"""`phalanx plan --model` run as users run it: the installed `phalanx` console script
from a folder holding the factory's module (no `python -m`, so no '' on sys.path), and
`--measure` training the user's model on 2 gloo ranks beside its prediction."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

USER_LM = Path(__file__).parents[1] / "user_lm.py"


def phalanx_script() -> str:
    found = Path(sys.executable).parent / "phalanx"
    if not found.exists():
        pytest.skip("no installed `phalanx` console script beside this Python")
    return str(found)


def run_here(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([phalanx_script(), *argv], cwd=folder, capture_output=True,
                          text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "mylm").mkdir()
    (tmp_path / "mylm" / "__init__.py").write_text("")
    shutil.copy(USER_LM, tmp_path / "mylm" / "model.py")
    shutil.copy(USER_LM, tmp_path / "flatlm.py")
    return tmp_path


def test_the_console_script_finds_a_factory_in_the_current_folder(folder: Path):
    for spec in ("mylm.model:conv_lm", "flatlm:conv_lm"):
        done = run_here(folder, "plan", "--model", spec, "--world-size", "2",
                        "--block-size", "16", "--micro-batch-size", "4", "--gpu", "h100")
        assert done.returncode == 0, done.stderr[-2000:]
        assert "model: yours" in done.stdout and "step time at MFU" in done.stdout
        assert "predicted for MiniGPT only" not in done.stdout


@pytest.mark.solo
def test_measure_trains_the_users_model_and_the_prediction_holds(folder: Path):
    done = run_here(folder, "plan", "--model", "mylm.model:conv_lm", "--world-size", "2",
                    "--block-size", "16", "--micro-batch-size", "2", "--optimizer",
                    "adamw", "--measure", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["model"] == "yours"
    assert set(result["measured"]) == {"ddp", "zero", "fsdp", "fsdp (no reshard)"}
    for name, m in result["measured"].items():
        assert 0.9 <= m["peak"]["ratio"] <= 1.1, (name, m["peak"])
        for part in ("parameters", "gradients", "optimizer", "activations"):
            assert m[part]["within"], (name, part, m[part])


def test_measure_refuses_a_model_the_trainer_cannot_feed_in_one_line(folder: Path):
    (folder / "vision.py").write_text("import torch\n\ndef f():\n"
                                      "    return torch.nn.Linear(2, 2), torch.ones(1, 2)\n")
    done = run_here(folder, "plan", "--model", "vision:f", "--world-size", "2", "--measure")
    assert done.returncode == 2 and done.stdout == ""
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "`--measure` trains your model as `phalanx train` does" in err[0]
    done = run_here(folder, "plan", "--model", "vision:f", "--world-size", "2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]  # planned (traced on its example)
    notes = json.loads(done.stdout)["user_notes"]
    assert any("remade at the planned micro-batch 8" in n for n in notes)
