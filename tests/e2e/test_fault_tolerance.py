"""Killed ranks: `phalanx train --max-restarts N` recovers through torch's elastic agent,
resumes from the newest committed checkpoint and ends bit-identical to an uninterrupted
run. Faults are injected with PHALANX_FAULT (SIGKILL, as the OOM killer would)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from phalanx.checkpoint.store import verify
from phalanx.report.goodput import summarise

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--grad-accum", "2", "--dropout", "0.1", "--max-steps", "12",
        "--checkpoint-every", "3", "--eval-every", "6", "--eval-batches", "1", "--log-every", "1",
        "--sample-tokens", "0", "--nproc-per-node", "2", "--threads-per-rank", "1"]


def train(out, corpus, cache, fault: str = "", *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PHALANX_FAULT": fault}
    return subprocess.run(
        [sys.executable, "-m", "phalanx", "train", *ARGS, "--data", str(corpus), "--cache-dir",
         str(cache), "--out", str(out), *extra], capture_output=True, text=True, timeout=300,
        env=env)


def losses(out) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, small_corpus_file, cache_dir):
    out = tmp_path_factory.mktemp("straight")
    proc = train(out, small_corpus_file, cache_dir)
    assert proc.returncode == 0, proc.stderr
    assert "is a straggler" not in proc.stdout  # a healthy run names nobody (runtime.pace)
    return out


def test_killed_ranks_recover_bit_identically(straight, tmp_path, small_corpus_file, cache_dir):
    # rank 1 dies after step 4; after the restart, rank 0 dies while writing checkpoint 9;
    # after the next one, rank 1 dies after step 11
    fault = ("rank=1,step=4,phase=step,attempts=0;"
             "rank=0,step=9,phase=checkpoint,attempts=1;"
             "rank=1,step=11,phase=step,attempts=2")
    proc = train(tmp_path, small_corpus_file, cache_dir, fault, "--max-restarts", "3")
    assert proc.returncode == 0, proc.stderr
    # each restart is one line: which rank died, the restart, where every rank resumed
    restarts = [re.match(r"phalanx: restart (\d) of at most 3 after (rank \d) was killed by "
                         r"SIGKILL; every rank resumed from (\S+) at step (\d+) ", line)
                for line in proc.stdout.splitlines() if line.startswith("phalanx: restart")]
    assert all(restarts), proc.stdout
    assert [(m[1], m[2], Path(m[3]).name, m[4]) for m in restarts] == [
        ("1", "rank 1", "step-00000003", "3"), ("2", "rank 0", "step-00000006", "6"),
        ("3", "rank 1", "step-00000009", "9")]
    assert "resumed from" not in proc.stdout.replace("every rank resumed from", "")
    assert "Traceback" not in proc.stdout + proc.stderr  # the survivors' are in their logs
    assert proc.stdout.count("model:") == 1  # the banner once, not once per attempt
    expected, got = load_file(str(straight / "model.safetensors")), \
        load_file(str(tmp_path / "model.safetensors"))
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key
    assert losses(tmp_path) == losses(straight)  # the lost steps' lines were replaced
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == \
        ["step-00000006", "step-00000009", "step-00000012"]
    # goodput (issue 45): four segments, from the steps each attempt resumed at; the steps
    # taken again after each restart are lost; the straight run lost none
    ledger = [json.loads(line) for line in (tmp_path / "goodput.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ledger if r["kind"] == "start"] == [0, 3, 6, 9]
    good, plain = summarise(tmp_path), summarise(straight)
    assert good is not None and plain is not None
    assert good.segments == 4 and good.recomputed_s > 0 and 0 < good.share < plain.share < 1
    assert plain.segments == 1 and plain.recomputed_s == 0
    said = [e for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines())
            if e["kind"] == "goodput"]
    assert said and said[-1]["message"].startswith("goodput ") and "(4 segments)" in \
        said[-1]["message"]


def test_a_rank_that_always_fails_exhausts_the_restarts(tmp_path, small_corpus_file, cache_dir):
    fault = "rank=1,step=2,phase=step,action=raise,attempts=always"
    proc = train(tmp_path, small_corpus_file, cache_dir, fault, "--max-restarts", "1")
    assert proc.returncode == 1
    message = proc.stderr.strip().splitlines()[-1]
    # rank 1 is named, with its error, whichever of the two the agent saw exit first
    assert re.match(r"phalanx: error: \[rank 1\] the job failed after 1 restart\(s\): rank 1 "
                    r"(exited with code 1|failed \(then the agent stopped it\)): InjectedFault: "
                    r"injected fault at step 2 \(step\)", message), message


def test_export_consolidates_a_two_rank_checkpoint(straight, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "phalanx", "export", str(straight), "--out",
                           str(tmp_path / "w" / "final.safetensors")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "exported step 12 of" in proc.stdout
    exported = load_file(str(tmp_path / "w" / "final.safetensors"))  # plain safetensors
    trained = load_file(str(straight / "model.safetensors"))
    assert exported.keys() == trained.keys()
    assert all(torch.equal(exported[k], trained[k]) for k in trained)
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    assert config["n_embd"] == 32 and not config["tie_word_embeddings"]  # the default: untied
    assert "lm_head.weight" in exported
    bad = subprocess.run([sys.executable, "-m", "phalanx", "export", str(tmp_path), "--out",
                          str(tmp_path / "x.safetensors")], capture_output=True, text=True)
    assert bad.returncode == 2 and "holds no valid checkpoint" in bad.stderr


@pytest.mark.parametrize("strategy", ["ddp", "zero", "fsdp"])
def test_verify_resume_passes_on_the_trainer(tmp_path, small_corpus_file, cache_dir, strategy):
    args = [a for a in ARGS if a not in ("--checkpoint-every", "3")]
    proc = subprocess.run(
        [sys.executable, "-m", "phalanx", "verify-resume", *args, "--data",
         str(small_corpus_file), "--cache-dir", str(cache_dir), "--out", str(tmp_path),
         "--strategy", strategy, "--async-checkpoint"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if strategy != "ddp":  # the rest is the same for every strategy
        assert "PASS: resume is exact" in proc.stdout
        return
    assert "12 steps straight, then 6 + resume + 6 on 2 rank(s)" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS: resume is exact — 12 losses, "
                                                          "the 48 samples per rank")
    short = subprocess.run([sys.executable, "-m", "phalanx", "verify-resume", "--max-steps", "1",
                            "--out", str(tmp_path)], capture_output=True, text=True)
    assert short.returncode == 2 and "`--max-steps` must be at least 2" in short.stderr


def test_async_checkpoints_commit_the_same_training(straight, tmp_path, small_corpus_file,
                                                    cache_dir):
    proc = train(tmp_path, small_corpus_file, cache_dir, "", "--async-checkpoint")
    assert proc.returncode == 0, proc.stderr
    expected, got = load_file(str(straight / "model.safetensors")), \
        load_file(str(tmp_path / "model.safetensors"))
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == \
        ["step-00000006", "step-00000009", "step-00000012"]
    assert all(verify(p) is None for p in root.glob("step-*"))
    assert (root / "latest").read_text() == "step-00000012"
    assert not list(root.glob(".tmp-*"))
