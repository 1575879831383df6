"""Every strategy starts from the one-rank run's weights, bit for bit (issue 40.1).

`phalanx.init` seeds each rank differently, so a model built after it differs per rank.
DDP broadcasts rank 0's weights when constructed; FSDP2 has no such step, and a meta
model used to be initialised shard by shard from each rank's generator — both gave a
splice of every rank's init that changed with the world size. The worker
(start_scenarios.py) builds a transformers GPT-2, a module with its own `init_weights`
and a meta-device model under single at 1 rank and ddp/zero/fsdp at 2 and 3 ranks (3:
shards of uneven size); each must equal the one-rank weights exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from phalanx.launch.agent import launch_workers

HERE = Path(__file__).parent
KINDS = ["transformers", "own_init", "meta"]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    pytest.importorskip("transformers", reason="transformers is not installed (the `test` "
                        "extra has it: pip install -c constraints.txt -e '.[test]')")
    where = tmp_path_factory.mktemp("start")
    for world in (1, 2, 3):
        launch_workers([str(HERE / "start_scenarios.py"), str(where)], world, threads=1)
    return where


def load(out: Path, name: str) -> dict:
    return torch.load(out / f"{name}.pt", weights_only=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("strategy", ["ddp", "zero", "fsdp"])
def test_weights_after_setup_equal_the_one_rank_run(out, strategy, world, kind):
    one = load(out, f"single-{kind}-w1")
    got = load(out, f"{strategy}-{kind}-w{world}")
    assert sorted(got) == sorted(one)
    differ = [k for k in one if not torch.equal(got[k], one[k])]
    assert not differ, f"{strategy} at {world} ranks: {differ} differ from the one-rank run"


def test_a_planted_splice_fails_setup_naming_the_tensor(out):
    message = (out / "splice.txt").read_text()
    assert "differs on rank(s)" in message and "`blocks.0.weight`" in message, message
