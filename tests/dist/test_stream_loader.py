"""`run.loader` over an IterableDataset that shards itself, on 2 gloo ranks (launched
once): uneven shares end every rank's epoch together (DDP trains through it without a
hang; `even=False` leaves each rank its own share), and a save after one batch resumes each
rank's stream exactly from the dataset's own state (data/stream_loader.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx.launch.agent import launch_workers

SCRIPT = str(Path(__file__).parent / "stream_scenarios.py")
SHARES = {0: [[0, 2], [4, 6], [8, 10], [12]], 1: [[1, 3], [5, 7], [9]]}


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    where = tmp_path_factory.mktemp("stream")
    launch_workers([SCRIPT, str(where)], 2, threads=1)
    return {r: json.loads((where / f"stream-r{r}.json").read_text()) for r in (0, 1)}


@pytest.mark.parametrize("rank", [0, 1])
def test_uneven_shares_end_every_ranks_epoch_together(seen, rank):
    assert seen[rank]["even"] == SHARES[rank][:3]  # rank 0's 4th batch: not taken
    assert seen[rank]["uneven"] == SHARES[rank]  # even=False: each rank its whole share


@pytest.mark.parametrize("rank", [0, 1])
def test_a_resume_continues_each_ranks_stream_from_its_own_state(seen, rank):
    mine = seen[rank]
    assert mine["first"] == SHARES[rank][0] and mine["step"] == 1
    assert mine["resumed"] == mine["rest"] == SHARES[rank][1:3]
