"""`phalanx train --profile-steps 5-7` on 2 ranks: each rank's trace, the summary of both,
the run report's breakdown, and the `wrote:` line; the same training logs to W&B offline
(`--tracker wandb`, when the trackers extra is installed): one training for both."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--max-steps", "8", "--eval-every", "8", "--log-every", "1",
        "--sample-tokens", "0", "--nproc-per-node", "2"]


def _wandb_installed() -> bool:
    try:
        import wandb  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def profiled(tmp_path_factory, corpus_file, cache_dir):
    """One 2-rank training for this file's tests (each is ~15 s of CI): steps 5-7
    profiled, and logged to W&B offline when the trackers extra is installed."""
    out = tmp_path_factory.mktemp("profiled") / "run"
    # W&B's own timeouts raised: under two xdist workers its service once did not start
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "WANDB_INIT_TIMEOUT": "300", "WANDB__SERVICE_WAIT": "300"}
    env.pop("WANDB_DIR", None)
    wandb = ["--tracker", "wandb"] if _wandb_installed() else []
    done = subprocess.run([sys.executable, "-m", "phalanx", "train", *TINY, "--profile-steps",
                           "5-7", *wandb, "--data", str(corpus_file), "--cache-dir",
                           str(cache_dir), "--out", str(out)], capture_output=True, text=True,
                          timeout=300, env=env)
    return out, done


def test_profile_steps_on_two_ranks(profiled):
    out, done = profiled
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "profile" / "summary.json").read_text())
    assert summary["steps"] == [5, 7] and len(summary["ranks"]) == 2
    for rank, found in enumerate(summary["ranks"]):
        trace = json.loads(gzip.decompress((out / "profile" / f"rank-{rank}.json.gz")
                                           .read_bytes()))
        names = {e.get("name") for e in trace["traceEvents"]}
        assert {"phalanx::data", "phalanx::forward", "phalanx::backward",
                "phalanx::optimizer"} <= names, rank
        assert all(v > 0 for v in found["phases_ms"].values()), found
        assert found["wall_ms"] >= sum(found["phases_ms"].values()) > 0
        assert found["collectives_ms"] > 0  # DDP's all-reduce, launched from the main thread
    page = (out / "report.html").read_text()
    assert "torch.profiler over steps 5–7" in page and "<td>1</td>" in page
    wrote = next(line for line in done.stdout.splitlines() if line.startswith("wrote: "))
    assert f"{out}/profile/" in wrote


def test_the_trainer_logs_to_wandb_offline_from_rank_0(profiled):
    """Issue 48: `--tracker wandb` on 2 ranks: one W&B run, written by rank 0, holding the
    trainer's records (loss, lr, val loss), its config the run's."""
    pytest.importorskip("wandb", reason="the trackers extra (wandb) is not installed")
    from wandb_files import history

    out, done = profiled
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tracker wandb" not in done.stdout + done.stderr  # no warning of it
    assert list(out.glob("wandb/offline-run-*")), done.stdout + done.stderr  # why, if not
    rows = history(out)  # (exactly one offline run: `history` unpacks one file)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["_step"], r["loss"]) for r in rows if "loss" in r] == \
        [(m["step"], m["loss"]) for m in metrics if "loss" in m]
    assert any("val_loss" in r for r in rows)
