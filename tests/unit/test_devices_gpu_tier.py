"""The CUDA tier on a machine without a GPU: its modules import, its tests are skipped
with their reason, and benchmarks/gpu_suite.py parses its arguments and formats figures
(fake ones here) into the markdown docs/gpu.md carries."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "tests" / "cuda"
if str(CUDA_DIR) not in sys.path:  # where the tier's modules find `cuda_helpers`
    sys.path.append(str(CUDA_DIR))


def load(path: Path):
    """A module from its file, without putting its folder on sys.path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_suite = load(ROOT / "benchmarks" / "gpu_suite.py")

FAKE = {
    "environment": {"device_name": "NVIDIA H100 80GB HBM3", "peak_row": "H100 SXM",
                    "peak_tflops": 989.0, "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3",
                    "when": "2026-01-01T00:00:00+00:00"},
    "tests": [{"test": "tests.cuda.test_cuda_fsdp::test_fsdp2_bf16_policy_matches_ddp",
               "outcome": "passed", "seconds": 41.5, "message": ""},
              {"test": "tests.cuda.test_cuda_runtime::test_local_rank_one_is_pinned",
               "outcome": "skipped", "seconds": 0.0, "message": "needs 2 GPUs | one"}],
    "figures": [{"test": "x", "figure": "fsdp2 vs ddp", "worst_loss_abs": 0.0123456}],
    "throughput": [{"compile": False, "micro_batch_size": 8, "tokens_per_s": 180000.0,
                    "mfu": 0.1423, "step_s": 0.0455, "max_allocated": 12 * 2**30},
                   {"compile": True, "error": "Traceback ...\nRuntimeError: boom"}],
    "wall_s": 512.0,
}


@pytest.mark.parametrize("name", ["worker", "cuda_helpers", "test_cuda_runtime",
                                  "test_cuda_training", "test_cuda_fsdp", "test_cuda_kernels",
                                  "test_cuda_memory", "test_cuda_mfu"])
def test_the_tier_imports_without_a_gpu(name):
    load(CUDA_DIR / f"{name}.py")


def test_every_scenario_the_tests_name_exists():
    worker = load(CUDA_DIR / "worker.py")
    named = set()
    for path in CUDA_DIR.glob("test_cuda_*.py"):
        text = path.read_text()
        named |= {part.split('"')[1] for part in text.split("scenario(")[1:]
                  if part.startswith('"')}
    assert named and named <= set(worker.SCENARIOS), named - set(worker.SCENARIOS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip on a machine "
                                                      "without a GPU")
def test_without_a_gpu_the_tier_is_skipped_with_its_reason():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", str(CUDA_DIR), "-q",
                           "-rs", "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "passed" not in proc.stdout and "skipped" in proc.stdout
    assert "needs a CUDA GPU: torch.cuda.is_available() is False" in proc.stdout


def test_arguments_are_parsed_and_bad_ones_refused(capsys):
    args = gpu_suite.parse_args(["--out", "f.json", "--micro-batch-size", "4"])
    assert (args.out, args.micro_batch_size, args.steps, args.doc) == ("f.json", 4, 30, None)
    with pytest.raises(SystemExit):
        gpu_suite.parse_args(["--steps", "0"])


def test_figures_render_as_markdown_tables():
    md = gpu_suite.render(FAKE)
    assert "**NVIDIA H100 80GB HBM3** (peak 989 TFLOP/s dense bf16 (H100 SXM))" in md
    assert "1 passed, 1 skipped." in md
    assert "| `test_cuda_fsdp::test_fsdp2_bf16_policy_matches_ddp` | passed | 41.5 |  |" in md
    assert "needs 2 GPUs \\| one" in md  # a pipe cannot break the table
    assert "| eager, micro-batch 8 | 180,000 | 14.2% | 45.5 | 12.0 |" in md
    assert "| compiled | failed: RuntimeError: boom | | | |" in md
    assert "| fsdp2 vs ddp | worst_loss_abs 0.01235 |" in md


def test_an_unknown_device_renders_without_mfu():
    fake = json.loads(json.dumps(FAKE))
    fake["environment"].update(device_name="NVIDIA A10G", peak_row=None, peak_tflops=None)
    fake["throughput"][0]["mfu"] = None
    md = gpu_suite.render(fake)
    assert "unknown device: no MFU" in md and "no MFU (unknown device)" in md


def test_render_fills_the_docs_section(tmp_path, capsys):
    saved, doc = tmp_path / "figures.json", tmp_path / "gpu.md"
    saved.write_text(json.dumps(FAKE))
    doc.write_text(f"# GPU\n\n{gpu_suite.START}\nnone yet\n{gpu_suite.END}\n\ntail\n")
    assert gpu_suite.main(["--render", str(saved), "--doc", str(doc)]) == 1  # a failed row
    text = doc.read_text()
    assert "none yet" not in text and "180,000" in text and text.endswith("\n\ntail\n")
    assert "180,000" in capsys.readouterr().out


def test_the_docs_have_the_section_the_suite_fills():
    text = (ROOT / "docs" / "gpu.md").read_text()
    assert gpu_suite.START in text and gpu_suite.END in text
    assert "python -m pytest -m cuda tests/cuda" in text
