"""TensorBoard: `phalanx train` writes OUT/tb/ with the same figures as metrics.jsonl, read
back with TensorBoard's own reader; a resumed run drops the lost continuation's events."""

from __future__ import annotations

import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_fault_tolerance import train

TAGS = {"train/loss": "loss", "val/loss": "val_loss", "train/lr": "lr",
        "train/grad_norm": "grad_norm", "train/tokens_per_s": "tokens_per_s",
        "train/step_time_s": "step_time_s", "train/memory_mib": "memory_mib",
        "val/nats_per_byte": "val_nats_per_byte", "train/slowest_rank": "slowest_rank",
        "train/slowest_to_fastest": "slowest_to_fastest",
        "train/slowest_to_own_best": "slowest_to_own_best"}  # (the straggler check's)


def scalars(out) -> dict[str, list[tuple[int, float]]]:
    tb = EventAccumulator(str(out / "tb"))
    tb.Reload()
    return {tag: [(e.step, e.value) for e in tb.Scalars(tag)] for tag in tb.Tags()["scalars"]}


def test_event_files_hold_what_metrics_jsonl_holds(tmp_path, small_corpus_file, cache_dir):
    proc = train(tmp_path, small_corpus_file, cache_dir, "rank=1,step=7,action=kill",
                 "--max-restarts", "1")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    found = scalars(tmp_path)
    assert set(found) == set(TAGS), found.keys()
    for tag, key in TAGS.items():
        expected = [(r["step"], r[key]) for r in records if key in r]
        assert [s for s, _ in found[tag]] == [s for s, _ in expected], tag  # once per step
        for (_, got), (_, want) in zip(found[tag], expected):
            assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), (tag, got, want)
    assert [s for s, _ in found["train/loss"]] == list(range(1, 13))  # no step twice
    assert [s for s, _ in found["val/loss"]] == [6, 12]
