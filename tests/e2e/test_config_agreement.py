"""Ranks started with different settings (issue 25, section 3): hosts whose flags differ
trained a wrong model silently (`--lr`, `--seed`) or failed in a traceback that never
named the flag (`--n-embd`, `--max-steps`). Every rank now compares its settings at
start; a difference is one line, exit 2, naming the flag, the values and the ranks.

Two processes started the way torchrun / a multi-host script starts them (RANK,
WORLD_SIZE, MASTER_ADDR/PORT), each with its own flags."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from phalanx.train.agreement import disagreement
from runs import free_port

ARGS = ["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "32",
        "--micro-batch-size", "2", "--eval-every", "1000", "--eval-batches", "1",
        "--sample-tokens", "0", "--max-steps", "3", "--threads-per-rank", "1",
        "--timeout-s", "60", "--hang-timeout-s", "0"]


def _ranks(tmp_path, corpus, cache, per_rank: list[list[str]]) -> list[tuple[int, str]]:
    port, procs = free_port(), []
    for rank, extra in enumerate(per_rank):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(len(per_rank)), "LOCAL_WORLD_SIZE": str(len(per_rank)),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "phalanx", "train", *ARGS, "--data", str(corpus),
             "--cache-dir", str(cache), "--out", str(tmp_path / f"run{rank}"), *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        _, err = proc.communicate(timeout=180)
        results.append((proc.returncode, err))
    return results


@pytest.mark.parametrize("flag,a,b", [("--lr", "2e-3", "1e-3"), ("--n-embd", "32", "64"),
                                      ("--max-steps", "3", "4")])
def test_ranks_with_different_settings_stop_in_one_line(
        flag, a, b, tmp_path, small_corpus_file, cache_dir):
    results = _ranks(tmp_path, small_corpus_file, cache_dir, [[flag, a], [flag, b]])
    for code, err in results:
        assert code == 2, err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert f"`{flag}` is" in lines[0] and "on rank 0" in lines[0] and "on rank 1" in lines[0]


def test_ranks_with_the_same_settings_train(tmp_path, small_corpus_file, cache_dir):
    results = _ranks(tmp_path, small_corpus_file, cache_dir, [[], []])
    assert [code for code, _ in results] == [0, 0], results


def test_the_message_names_every_difference_and_host():
    records = [{"host": "a", "settings": {"train.lr": 0.002, "train.seed": 1}},
               {"host": "a", "settings": {"train.lr": 0.002, "train.seed": 1}},
               {"host": "b", "settings": {"train.lr": 0.001, "train.seed": 2}},
               {"host": "b", "settings": {"train.lr": 0.001, "train.seed": 2}}]
    text = disagreement(records)
    assert "`--lr` is 0.002 on ranks 0-1 (a), 0.001 on ranks 2-3 (b)" in text
    assert "`--seed` is 1 on ranks 0-1 (a), 2 on ranks 2-3 (b)" in text
