"""Exact resume, also at another world size, proven with gloo ranks on CPU.

The 2-rank launch (conftest `results`) trains 16 steps straight, and 8 steps then a
resume to 16, with dropout, accumulation and an epoch boundary before the stop. The
8-step checkpoint is then resumed on 1 rank (here) and on 3 ranks (a launch), and every
training sample read is accounted for against the sampler's global stream.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

import phalanx
from phalanx.data.corpus import prepare
from phalanx.data.sampler import ShardedBatchSampler
from phalanx.launch.agent import launch_workers

sys.path.insert(0, str(Path(__file__).parent))
from resume_scenarios import HALF, STEPS, train_recorded  # noqa: E402

GLOBAL_BATCH_PER_RANK = 2 * 2  # micro-batch × accumulation


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def stream(splits, start: int, count: int) -> list[int]:
    """Sample ids at global stream positions [start, start + count) for this config."""
    windows = (splits.n_train - 1) // 32
    return ShardedBatchSampler(windows, 1, 0, 1, seed=7, stream=True).indices(start, count)


@pytest.fixture(scope="module")
def splits(small_corpus_file, cache_dir):
    return prepare(str(small_corpus_file), str(cache_dir), 0.1)


def test_the_stop_falls_mid_epoch(results, splits):
    windows = (splits.n_train - 1) // 32
    position = load(results / "first-half-rank0.pt")["position"]
    assert position == HALF * 2 * GLOBAL_BATCH_PER_RANK
    assert position > windows and position % windows != 0  # after a reshuffle, mid-epoch


def test_resume_is_bitwise_exact(results):
    for rank in (0, 1):
        straight = load(results / f"straight-rank{rank}.pt")
        first, second = (load(results / f"{h}-half-rank{rank}.pt") for h in ("first", "second"))
        assert second["step"] == straight["step"] == STEPS
        for key, value in straight["state"].items():
            assert torch.equal(value, second["state"][key]), (rank, key)
        assert first["losses"] + second["losses"] == straight["losses"]
        assert len(straight["losses"]) == STEPS
        assert first["ids"] + second["ids"] == straight["ids"]  # the same data order


def assert_every_sample_once(splits, phases: list[list[int]], end: int) -> None:
    """The union of what every rank read equals the stream [0, end): none skipped or twice."""
    seen = Counter(i for ids in phases for i in ids)
    assert seen == Counter(stream(splits, 0, end))


def test_each_rank_checksums_what_it_writes(results):
    """Rank 0's commit reads back only the small sidecar it writes itself: rank 1's
    data file arrives with its checksum, computed while rank 1 wrote it."""
    import json

    from phalanx.checkpoint.digest import file_digest
    from phalanx.checkpoint.store import MANIFEST

    timings = json.loads((results / "last-save.json").read_text())
    checkpoint = sorted((results / "straight" / "checkpoints").glob("step-*"))[-1]
    files = json.loads((checkpoint / MANIFEST).read_text())["files"]
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(files)
    assert timings["reread_bytes"] == files["train_state.json"]["size"]
    for name, info in files.items():
        assert info["xxh3_128"] == file_digest(checkpoint / name), name


def test_resume_on_one_rank(results, splits, tmp_path):
    with phalanx.init(seed=7, threads=1) as run:
        result, ids = train_recorded(run, splits, tmp_path, STEPS, resume=str(results / "at-half"))
    first = [load(results / f"first-half-rank{r}.pt")["ids"] for r in (0, 1)]
    end = HALF * 2 * GLOBAL_BATCH_PER_RANK + (STEPS - HALF) * 1 * GLOBAL_BATCH_PER_RANK
    assert result.state.position == end
    assert_every_sample_once(splits, first + [ids], end)
    assert len(result.losses) == STEPS - HALF and all(loss < 6 for loss in result.losses)


def test_resume_on_three_ranks(results, small_corpus_file, cache_dir, splits):
    script = str(Path(__file__).parent / "resume_scenarios.py")
    launch_workers([script, str(results), str(small_corpus_file), str(cache_dir)], 3, threads=1)
    first = [load(results / f"first-half-rank{r}.pt")["ids"] for r in (0, 1)]
    resumed = [load(results / f"resumed-3-rank{r}.pt") for r in (0, 1, 2)]
    end = HALF * 2 * GLOBAL_BATCH_PER_RANK + (STEPS - HALF) * 3 * GLOBAL_BATCH_PER_RANK
    assert {r["position"] for r in resumed} == {end}
    assert_every_sample_once(splits, first + [r["ids"] for r in resumed], end)
    for key, value in resumed[0]["state"].items():  # the 3 replicas agree after resharding
        assert torch.equal(value, resumed[1]["state"][key])
        assert torch.equal(value, resumed[2]["state"][key])

