"""The sharding rule: a step's global batch is the same samples whatever the world size."""

from __future__ import annotations

import itertools

import pytest

from phalanx.data.sampler import ShardedBatchSampler
from phalanx.errors import UserError


def step_samples(n, batch, world, accum, steps, seed=3):
    """Per optimizer step: the set of sample ids seen by all ranks and micro-steps."""
    iters = [iter(ShardedBatchSampler(n, batch, r, world, seed=seed, stream=True))
             for r in range(world)]
    out = []
    for _ in range(steps):
        ids = []
        for _ in range(accum):
            for it in iters:
                ids.extend(next(it))
        out.append(sorted(ids))
    return out


@pytest.mark.parametrize("batch, world, accum", [(8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 4, 2), (2, 1, 4)])
def test_global_batches_do_not_depend_on_world_size(batch, world, accum):
    reference = step_samples(50, 8, 1, 1, steps=20)
    assert step_samples(50, batch, world, accum, steps=20) == reference


def test_ranks_are_disjoint_and_an_epoch_covers_each_sample_once():
    n, batch, world = 48, 4, 3
    samplers = [ShardedBatchSampler(n, batch, r, world, seed=1) for r in range(world)]
    per_rank = [list(itertools.chain.from_iterable(s)) for s in samplers]
    assert all(len(ids) == n // world for ids in per_rank)
    assert sorted(itertools.chain.from_iterable(per_rank)) == list(range(n))


def test_each_iteration_is_a_new_shuffled_epoch_without_set_epoch():
    s = ShardedBatchSampler(64, 8, 0, 2, seed=5)
    first, second = list(s), list(s)
    assert first != second and s.epoch == 2
    again = ShardedBatchSampler(64, 8, 0, 2, seed=5)
    assert list(again) == first  # deterministic in (seed, epoch)


def test_incomplete_global_batches_are_dropped_equally_on_all_ranks():
    lens = [len(list(ShardedBatchSampler(21, 4, r, 2))) for r in range(2)]
    assert lens == [2, 2]


def test_stream_resumes_from_a_position():
    full = ShardedBatchSampler(30, 3, 1, 2, seed=2, stream=True)
    it = iter(full)
    batches = [next(it) for _ in range(12)]
    resumed = iter(ShardedBatchSampler(30, 3, 1, 2, seed=2, stream=True, position=5 * 6))
    assert [next(resumed) for _ in range(7)] == batches[5:]


def test_too_small_dataset_is_refused():
    with pytest.raises(UserError, match="fewer than one global batch"):
        ShardedBatchSampler(5, 4, 0, 2)
