"""`phalanx bench` end to end on 2 gloo ranks with a tiny model: one step of each peer
(plain DDP, Accelerate, Fabric, Phalanx) and of each default variant, the profile, and
both scaling sweeps; progress and Ctrl-C."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest

from phalanx.bench.peers import available

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--nproc-per-node", "2", "--threads-per-rank", "1"]


@pytest.mark.skipif(not (available("accelerate") and available("fabric")),
                    reason="the bench extra (accelerate, lightning) is not installed")
def test_bench_runs_every_peer_profile_and_scaling(tmp_path, small_corpus_file, cache_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", "bench", *TINY, "--data", str(small_corpus_file),
         "--cache-dir", str(cache_dir), "--out", str(tmp_path), "--peers", "--profile",
         "--scaling", "--defaults", "--repeats", "1", "--steps", "1", "--warmup", "0"],
        capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    bench = tmp_path / "bench"
    res = json.loads((bench / "results.json").read_text())
    assert list(res["peers"]) == ["plain", "accelerate", "fabric", "phalanx"]
    assert all(len(v) == 1 and v[0] > 0 for v in res["peers"].values())
    assert set(res["profile"]["phases_ms"]) == {"data", "forward", "backward", "optimizer"}
    assert res["profile"]["allreduce_alone_ms"] > 0 and res["profile"]["rank_wait_ms"] >= 0
    assert [d["setting"] for d in res["defaults"]] == [
        "DDP static_graph", "DDP gradient_as_bucket_view", "DDP bucket sizes",
        "AdamW implementation"]
    assert all(len(d["times"]) == 1 and d["times"][0] > 0 for d in res["defaults"])
    assert [r["ranks"] for r in res["scaling"]["weak"]] == [1, 2]
    assert [r["global_batch"] for r in res["scaling"]["strong"]] == [4, 4]
    assert res["scaling"]["weak"][0]["efficiency"] == [1.0, 1.0, 1.0]  # t(1) / t(1)
    assert 0 < res["scaling"]["strong"][1]["efficiency"][0] < 2
    assert (bench / "trace-rank0.json").exists() and (bench / "trace-rank1.json").exists()
    text = (bench / "report.md").read_text()
    assert "| fabric |" in text and "Exposed communication" in text and "| strong | 2 |" in text
    assert "| AdamW implementation | fused | for-loop |" in text
    assert (bench / "scaling.png").exists()
    wrote = proc.stdout.strip().splitlines()[-1]
    assert wrote == f"wrote: {bench / 'report.md'}, {bench / 'results.json'}, " \
        f"{bench / 'peers.png'}, {bench / 'scaling.png'}", wrote


def test_bench_refuses_bad_counts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "phalanx", "bench", "--repeats", "0",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--repeats: must be between 1 and 10000, got 0" in proc.stderr


@pytest.mark.parametrize("strategy", ["fsdp", "zero"])
def test_bench_times_a_sharded_strategy_beside_ddp(tmp_path, small_corpus_file, cache_dir,
                                                    strategy):
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", "bench", *TINY, "--data", str(small_corpus_file),
         "--cache-dir", str(cache_dir), "--out", str(tmp_path), "--profile", "--defaults",
         "--strategy", strategy, "--repeats", "2", "--steps", "1", "--warmup", "0"],
        capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "bench" / "results.json").read_text())
    assert res["strategy"] == strategy and list(res["peers"]) == ["phalanx", "phalanx-ddp"]
    report = (tmp_path / "bench" / "report.md").read_text()
    assert "| phalanx-ddp |" in report and f"({strategy}) on" in report
    collectives = res["profile"]["collectives_ms"]
    if strategy == "fsdp":  # where the extra time goes, by kind
        assert collectives.get("FSDP::all_gather", 0) > 0, collectives
        assert "FSDP::post_backward_reduce" in collectives
        assert {d["setting"] for d in res["defaults"]} >= {
            "FSDP gradient sync under accumulation", "FSDP reshard_after_forward"}
    else:
        assert res["profile"]["exposed_comm_ms"] >= 0 and "c10d::broadcast_" in collectives


def test_bench_shows_progress_and_ctrl_c_leaves_a_partial_report(tmp_path, small_corpus_file,
                                                                 cache_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "phalanx", "bench", *TINY, "--data", str(small_corpus_file),
         "--cache-dir", str(cache_dir), "--out", str(tmp_path), "--repeats", "1000",
         "--steps", "2", "--warmup", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    seen = []
    for line in proc.stdout:  # rank 0's progress: a line per quarter of the phase
        seen.append(line)
        if line.startswith("bench: timing (251/1001)"):
            break
    assert seen[:2] == ["bench: timing (0/1001)\n", "bench: timing (251/1001)\n"], seen
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    [line] = err.strip().splitlines()  # no traceback, no agent log line
    assert re.fullmatch(r"phalanx: stopped by SIGINT after \d+ complete round\(s\): partial "
                        r"report at .*/bench/report\.md\.", line), line
    report = (tmp_path / "bench" / "report.md").read_text()
    assert "**Stopped early (Ctrl-C):" in report and "of the 1000 asked for" in report
    res = json.loads((tmp_path / "bench" / "results.json").read_text())
    assert res["stopped"] and res["repeats"] >= 250 and len(res["peers"]["phalanx"]) == \
        res["repeats"]
