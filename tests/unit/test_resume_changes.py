"""What a resume refuses: another optimizer, another tokenizer (down to a BPE retrained
with other merges) — and what it still accepts: a checkpoint written before the
architecture options and tokenizers existed, trained on bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from phalanx.config.sections import LEGACY, build_config, from_dict
from phalanx.errors import UserError
from phalanx.train.changes import check_compatible

BYTES = {"kind": "bytes", "label": "bytes", "vocab_size": 256, "digest": None}
BPE = {"kind": "bpe", "label": "bpe 4096", "vocab_size": 4096, "digest": "aaaa"}


def meta(cfg, tokenizer=None, **train) -> dict:
    saved = cfg.to_dict()
    saved["train"].update(train)
    return {"config": saved, "train_state": {"step": 2}, "tokenizer": tokenizer,
            "vocab_size": (tokenizer or BYTES)["vocab_size"]}


def test_an_old_checkpoint_on_bytes_still_resumes_and_another_tokenizer_is_refused():
    cfg = build_config({k: dict(v) for k, v in LEGACY.items()})  # 0.1's recipe, today
    old = meta(cfg)
    for key in ("rope", "tie_embeddings", "qk_norm"):  # written before these existed
        old["config"]["model"].pop(key)
    old["config"]["train"].pop("optimizer")
    old.pop("tokenizer")
    assert check_compatible(cfg, old, Path("c"), tokenizer=BYTES) == []
    with pytest.raises(UserError, match="tokenizer `bytes`.*this run's is `bpe 4096`"):
        check_compatible(cfg, old, Path("c"), tokenizer=BPE)


def test_a_bpe_retrained_with_other_merges_is_refused():
    cfg = build_config({})
    with pytest.raises(UserError, match="same size with other merges"):
        check_compatible(cfg, meta(cfg, BPE), Path("c"), tokenizer={**BPE, "digest": "bbbb"})
    assert check_compatible(cfg, meta(cfg, BPE), Path("c"), tokenizer=BPE) == []


CORPUS = {"key": "0123456789abcdef", "n_train": 9000, "n_val": 500, "digest": "d1"}


def test_another_corpus_is_refused_and_an_unrecorded_one_is_said():
    cfg = build_config({})
    saved = meta(cfg)
    saved["train_state"]["corpus"] = CORPUS
    assert check_compatible(cfg, saved, Path("c"), corpus=CORPUS) == []
    moved = {**CORPUS, "key": "fedcba9876543210"}  # the same tokens from files moved
    assert check_compatible(cfg, saved, Path("c"), corpus=moved) == []
    grown = {**CORPUS, "key": "fedcba9876543210", "n_train": 9100, "digest": "d2"}
    with pytest.raises(UserError) as info:  # a file added to `--data`
        check_compatible(cfg, saved, Path("c"), corpus=grown)
    assert str(info.value).startswith(
        "checkpoint `c` was trained on another corpus: 9,000 training and 500 validation "
        "tokens (cache key 0123456789abcdef), and `--data` now gives 9,100 and 500 (cache "
        "key fedcba9876543210): resuming at its data cursor would read another token "
        "stream.")
    with pytest.raises(UserError, match="another corpus"):  # same counts, other tokens
        check_compatible(cfg, saved, Path("c"), corpus={**CORPUS, "digest": "d3"})
    said = check_compatible(cfg, meta(cfg), Path("c"), corpus=CORPUS)  # an older checkpoint
    assert said == ["the data is not checked: the checkpoint was written before Phalanx "
                    "recorded its corpus, so `--data` may not be the corpus it was trained "
                    "on"]


def test_another_optimizer_is_refused_and_a_new_muon_rate_is_said():
    cfg = build_config({"train": {"optimizer": "muon", "muon_lr": 0.03}})
    with pytest.raises(UserError, match="--optimizer adamw.*--optimizer muon"):
        check_compatible(cfg, meta(cfg, optimizer="adamw"), Path("c"))
    changes = check_compatible(cfg, meta(cfg, muon_lr=0.02), Path("c"))
    assert changes == ["--muon-lr 0.02 → 0.03"]


def test_a_wsd_schedule_re_sized_is_said_with_its_own_rates():
    cfg = build_config({"train": {"lr_schedule": "wsd", "max_steps": 20, "warmup_steps": 1}})
    old = meta(cfg, max_steps=10)
    old["train_state"]["step"] = 8  # decaying in the old run, at the peak in the new one
    (line,) = [c for c in check_compatible(cfg, old, Path("c")) if "schedule" in c]
    assert line.startswith("the wsd schedule now spans 20 steps instead of 10: at step 9 "
                           "the learning rate is 2.00e-03 where the old schedule had 1.40e-03")


def test_a_saved_config_without_the_new_fields_means_the_old_recipe():
    saved = build_config({}).to_dict()
    for section, fields in LEGACY.items():
        for key in fields:
            saved[section].pop(key)
    cfg = from_dict(saved)
    assert (cfg.model.rope, cfg.model.tie_embeddings, cfg.model.activation) == (
        False, True, "gelu")
    assert (cfg.train.optimizer, cfg.train.lr_schedule, cfg.data.tokenizer) == (
        "adamw", "cosine", "bytes")


def test_another_world_is_said_alike_by_the_trainer_and_a_script():
    """Issue 40.8: `run.resume` says a resume on another world the way `phalanx train`
    does (runtime.world_change, shared); a checkpoint that did not record its world is
    resumed without the claim."""
    from phalanx.runtime.world_change import WORLD_KEY, script_resume, world_record

    cfg = build_config({})
    t = cfg.train
    per_rank = t.micro_batch_size * t.grad_accum
    saved = {**meta(cfg), "world_size": 2}
    assert check_compatible(cfg, saved, Path("c"), world=1) == [
        f"the global batch is {per_rank} sequences per step instead of {2 * per_rank} "
        f"(2 → 1 ranks); to keep {2 * per_rank}, resume with `--grad-accum "
        f"{2 * t.grad_accum}`"]
    script = {WORLD_KEY: world_record(2, 2, "ddp")}
    assert script_resume(script, 3, 3, "fsdp", (8, 4)) == (
        "; written by 2 rank(s) with ddp, now 3 with fsdp; changed: the global batch is 12 "
        "samples per micro-step instead of 8 (2 → 3 ranks)")  # no whole batch keeps 8
    assert script_resume(script, 2, 2, "zero", (8, 4)) == \
        "; written by 2 rank(s) with ddp, now 2 with zero"
    assert script_resume({}, 1, 1, "single", (8, 4)) == ""  # written before it was recorded
