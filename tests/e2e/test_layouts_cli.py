"""`phalanx train` with layout flags on the embedded default (tiny settings), 4 gloo ranks:
HSDP (--dp-replicate 2: the shards take the rest), then resumed under --dp-shard 4, and
the HSDP-written checkpoint exported to plain safetensors."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from safetensors.torch import load_file

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "4", "--log-every", "1",
        "--sample-tokens", "0", "--checkpoint-every", "2", "--nproc-per-node", "4"]


def train(out, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", "train", *TINY, "--out", str(out),
                           *argv], capture_output=True, text=True, timeout=300)


def assert_exported_equal(checkpoint, folder, written: dict) -> None:
    """`phalanx export CHECKPOINT` to plain safetensors holds exactly `written`."""
    exported = folder / "w.safetensors"
    done = subprocess.run([sys.executable, "-m", "phalanx", "export", str(checkpoint),
                           "--out", str(exported)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    weights = load_file(str(exported))
    assert sorted(weights) == sorted(written)
    assert all(torch.equal(weights[k], written[k]) for k in written)


def test_hsdp_from_the_command_line_and_its_resume_under_another_layout(tmp_path):
    out = tmp_path / "run"
    first = train(out, "--max-steps", "4", "--dp-replicate", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "strategy fsdp (dp_replicate 2 × dp_shard 2)" in first.stdout.splitlines()[0]
    job = json.loads((out / "job.json").read_text())
    assert job["config"]["dist"]["dp_replicate"] == 2  # the request, as given
    env = json.loads((out / "environment.json").read_text())
    assert env["strategy"] == "fsdp (dp_replicate 2 × dp_shard 2)"
    written = load_file(str(out / "model.safetensors"))  # step 4's, gathered at the end

    again = train(out, "--max-steps", "6", "--dp-shard", "4")
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = next(line for line in again.stdout.splitlines() if line.startswith("resumed"))
    assert "at step 4 (written by 4 rank(s) with fsdp (dp_replicate 2 × dp_shard 2), now 4 " \
           "with fsdp)" in resumed, resumed
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]

    # the HSDP-written checkpoint exported to plain safetensors: the run's own weights
    assert_exported_equal(out / "checkpoints" / "step-00000004", tmp_path / "export", written)


def test_tensor_parallel_from_the_command_line_and_its_resume_across_layouts(tmp_path):
    """tp 2 × dp_shard 2 for 4 steps, resumed under tp 2 × dp_replicate 2 to 6, then under
    dp_shard 4 (one sequence per rank: the same global batch of 4) to 8: every step
    recorded once, the data cursor where the arithmetic says, and the tp-written
    checkpoint exported to the weights the run wrote."""
    out = tmp_path / "run"
    first = train(out, "--max-steps", "4", "--tp", "2", "--dp-shard", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    lines = first.stdout.splitlines()
    assert "strategy fsdp (dp_shard 2 × tp 2)" in lines[0], lines[0]
    assert "2 × 1 accum × 2 data-parallel ranks (tp 2 share each batch) = 4 sequences" in \
        first.stdout, first.stdout
    written = load_file(str(out / "model.safetensors"))

    again = train(out, "--max-steps", "6", "--tp", "2", "--dp-replicate", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "now 4 with fsdp (dp_replicate 2 × tp 2)" in again.stdout, again.stdout
    last = train(out, "--max-steps", "8", "--dp-shard", "4", "--micro-batch-size", "1")
    assert last.returncode == 0, last.stdout + last.stderr
    resumed = next(line for line in last.stdout.splitlines() if line.startswith("resumed"))
    assert "at step 6 (written by 4 rank(s) with fsdp (dp_replicate 2 × tp 2), now 4 with " \
           "fsdp)" in resumed, resumed
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 9))
    saved = json.loads((out / "checkpoints" / "step-00000008" / "train_state.json").read_text())
    state = saved["meta"]["train_state"]  # 8 steps × a global batch of 4 sequences
    assert state["position"] == 8 * 4 and state["tokens_seen"] == 8 * 4 * 32, state

    assert_exported_equal(out / "checkpoints" / "step-00000004", tmp_path / "export", written)


def test_pipeline_stages_from_the_command_line_and_their_resume_under_dp_shard_4(tmp_path):
    """pp 2 × dp_shard 2 (two blocks, one a stage; 1F1B over the 2 micro-batches of
    --grad-accum 2) for 4 steps, evaluated through the schedule, the sample drawn from the
    gathered weights; resumed under dp_shard 4 to 6 (the same global batch of 8): every
    step recorded once, the data cursor exact, the pipeline-written checkpoint exported to
    the weights the run wrote."""
    out = tmp_path / "run"
    first = train(out, "--max-steps", "4", "--n-layer", "2", "--grad-accum", "2",
                  "--pp", "2", "--dp-shard", "2", "--sample-tokens", "8")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "strategy fsdp (pp 2 × dp_shard 2)" in first.stdout.splitlines()[0], first.stdout
    assert "2 × 2 accum × 2 data-parallel ranks (pp 2 share each batch) = 8 sequences" in \
        first.stdout, first.stdout
    assert "pipeline: 2 stages by blocks, this rank's stage 0 (blocks 0-0)" in first.stderr
    assert "step 4: val loss" in first.stdout and (out / "sample.txt").is_file()
    written = load_file(str(out / "model.safetensors"))  # the stages' weights, whole

    again = train(out, "--max-steps", "6", "--n-layer", "2", "--grad-accum", "2",
                  "--dp-shard", "4", "--micro-batch-size", "1")
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = next(line for line in again.stdout.splitlines() if line.startswith("resumed"))
    assert "at step 4 (written by 4 rank(s) with fsdp (pp 2 × dp_shard 2), now 4 with " \
           "fsdp)" in resumed, resumed
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    saved = json.loads((out / "checkpoints" / "step-00000006" / "train_state.json").read_text())
    assert saved["meta"]["train_state"]["position"] == 6 * 8

    assert_exported_equal(out / "checkpoints" / "step-00000004", tmp_path / "export", written)
