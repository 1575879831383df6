"""A user's stateful loader (torchdata's StatefulDataLoader with worker processes) in
`run.save` / `run.resume` on 2 gloo ranks: resumed mid-epoch in a new launch, each rank's
sample stream continues exactly; at another world size the resume is refused in one line
(runtime/user_loader.py says why)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phalanx.launch.agent import launch_workers

SCRIPT = str(Path(__file__).parent / "user_loader_scenarios.py")


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    pytest.importorskip("torchdata", reason="torchdata is not installed (the `test` extra "
                        "has it: pip install -c constraints.txt -e '.[test]')")
    where = tmp_path_factory.mktemp("user_loader")
    launch_workers([SCRIPT, str(where), "straight"], 2, threads=1)
    launch_workers([SCRIPT, str(where), "resumed"], 2, threads=1)
    launch_workers([SCRIPT, str(where), "resumed"], 1, threads=1)
    return where


@pytest.mark.parametrize("rank", [0, 1])
def test_a_stateful_dataloader_resumes_mid_epoch_exactly(out, rank):
    straight = json.loads((out / f"straight-r{rank}.json").read_text())
    resumed = json.loads((out / f"resumed-r{rank}.json").read_text())
    assert resumed["step"] == 3
    assert resumed["batches"] == straight[3:6]
    other = json.loads((out / f"straight-r{1 - rank}.json").read_text())
    assert straight != other  # each rank its own share: its own state was restored


def test_another_world_size_is_refused_in_one_line(out):
    said = (out / "refused-r0.txt").read_text()
    assert "holds the states of 2 ranks' own loaders (StatefulDataLoader), and this run has " \
           "1" in said and "run.loader" in said and "\n" not in said
