"""What changed between a checkpoint's run and the run resuming it: a different model
(its shape, or another `--model` factory) is refused; other changes are allowed and said
in the `resumed from …; changed:` line — with what they do to the training when that is
not obvious (the learning rate at the resume step under a re-sized schedule, the global
batch on another number of ranks) and how to avoid it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from phalanx.config.sections import LEGACY, Config, ModelConfig, flag_of
from phalanx.errors import UserError
from phalanx.runtime.world_change import batch_change
from phalanx.train.schedule import lr_at

ORIGINAL_SHAPE = ("n_layer", "n_head", "n_embd", "block_size", "bias")
SHAPE_FIELDS = (*ORIGINAL_SHAPE, "rope", "tie_embeddings")  # (added with the levers)
# a factory's model (`--model`) is shaped by the factory and the context it is given
FACTORY_SHAPE = ("factory", "block_size")


def shape_fields(cfg: Config) -> tuple[str, ...]:
    """The `[model]` fields whose change makes another model: MiniGPT's flags, or
    `--model` and `--block-size` (the factory's keywords) for a factory's model."""
    return FACTORY_SHAPE if cfg.model.factory is not None else SHAPE_FIELDS + ("factory",)


def _flag(name: str) -> str:
    f = next(f for f in dataclasses.fields(ModelConfig) if f.name == name)
    return flag_of(f)
LOGGED_FIELDS = ("lr", "min_lr", "max_steps", "lr_decay_steps", "warmup_steps",
                 "micro_batch_size", "grad_accum", "precision", "seed", "muon_lr",
                 "lr_schedule", "decay_fraction")
MODEL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
SAVED_BEFORE = {**MODEL_DEFAULTS, **LEGACY["model"]}  # what a field's absence meant


def check_compatible(cfg: Config, meta: dict, path: Path, world: int | None = None,
                     tokenizer: dict | None = None, corpus: dict | None = None) -> list[str]:
    """Refuse a different model shape (naming the fields), another optimizer, another
    tokenizer or another corpus (`tokenizer`, `corpus`: this run's records, when known:
    `TokenSplits.tokenizer_record`, `corpus_record`); return the changes allowed.
    `meta`: the checkpoint's sidecar meta; `world`: the data-parallel ranks resuming it
    (None: not known yet, before the launch)."""
    saved = meta.get("config", {})
    old_model, old_train = saved.get("model", {}), saved.get("train", {})
    old = {k: old_model.get(k, SAVED_BEFORE.get(k)) for k in shape_fields(cfg)}  # (fields
    differ = [f"{_flag(k)} {_shown(old[k])} → {_shown(getattr(cfg.model, k))}"  # added later)
              for k in shape_fields(cfg) if old[k] != getattr(cfg.model, k)]
    if differ:
        raise UserError(f"checkpoint `{path}` was written for another model shape: "
                        f"{', '.join(differ)}. Resume with the same model flags, or start "
                        f"fresh with `--resume never` (or another `--out`).")
    _same_optimizer(cfg, old_train.get("optimizer", LEGACY["train"]["optimizer"]), path)
    if tokenizer is not None:
        _same_tokenizer(tokenizer, meta, path)
    changes = [] if corpus is None else _same_corpus(corpus, meta, path)
    changes += [f"--{k.replace('_', '-')} {old_train.get(k)} → {getattr(cfg.train, k)}"
               for k in LOGGED_FIELDS if k in old_train and old_train[k] != getattr(cfg.train, k)]
    step = int(meta.get("train_state", {}).get("step", 0))
    return changes + _schedule(cfg, old_train, step) + _batch(cfg, old_train,
                                                              meta.get("world_size"), world)


def _same_optimizer(cfg: Config, old: str, path: Path) -> None:
    if old != cfg.train.optimizer:
        raise UserError(f"checkpoint `{path}` was trained with `--optimizer {old}`, and this "
                        f"run asks for `--optimizer {cfg.train.optimizer}`: their states "
                        f"differ (Muon keeps one momentum buffer per hidden matrix, AdamW "
                        f"two moments). Resume with `--optimizer {old}`, or start fresh with "
                        f"`--resume never`.")


def _same_tokenizer(now: dict, meta: dict, path: Path) -> None:
    """The checkpoint's tokenizer (runs before it was recorded trained on bytes when their
    vocabulary was 256) must be this run's, down to the BPE's merges."""
    then = meta.get("tokenizer") or (
        {"kind": "bytes", "label": "bytes", "vocab_size": 256, "digest": None}
        if meta.get("vocab_size") in (None, 256) else None)
    if then is None:
        return
    keys = ("kind", "vocab_size", "digest")
    if any(then.get(k) != now.get(k) for k in keys):
        same_size = then.get("kind") == now.get("kind") and \
            then.get("vocab_size") == now.get("vocab_size")
        why = (" (a BPE of the same size with other merges: it was trained again on data "
               "that changed since)" if same_size else "")
        raise UserError(f"checkpoint `{path}` was trained with the tokenizer "
                        f"`{then.get('label')}`, and this run's is `{now.get('label')}`{why}: "
                        f"its token ids would mean other text. Resume with the same "
                        f"`--tokenizer` and `--data` (a run on bytes before tokenizers "
                        f"existed: `--tokenizer bytes`), or start fresh with "
                        f"`--resume never`.")


def _same_corpus(now: dict, meta: dict, path: Path) -> list[str]:
    """The checkpoint's data cursor counts samples of one token stream: the corpus it
    recorded (its ids' digest and counts; the cache key says where they came from, and may
    differ for the same tokens from moved files) must be this run's. A checkpoint written
    before corpora were recorded resumes, and that is said."""
    then = meta.get("train_state", {}).get("corpus")
    if not isinstance(then, dict):
        return ["the data is not checked: the checkpoint was written before Phalanx recorded "
                "its corpus, so `--data` may not be the corpus it was trained on"]
    if all(then.get(k) == now.get(k) for k in ("digest", "n_train", "n_val")):
        return []
    raise UserError(f"checkpoint `{path}` was trained on another corpus: "
                    f"{_count(then.get('n_train'))} training and {_count(then.get('n_val'))} "
                    f"validation tokens (cache key {then.get('key')}), and `--data` now gives "
                    f"{_count(now.get('n_train'))} and {_count(now.get('n_val'))} (cache key "
                    f"{now.get('key')}): resuming at its data cursor would read another token "
                    f"stream. Resume with the data it was trained on (the same files, "
                    f"`--val-fraction` and `--text-field`), or start fresh with `--resume "
                    f"never` (or another `--out`).")


def _count(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def _shown(value: object) -> str:
    return "(none: MiniGPT)" if value is None else str(value)


def _schedule(cfg: Config, old: dict, step: int) -> list[str]:
    """The learning rate at the resume step, when the schedule's length changed."""
    old_span = old.get("lr_decay_steps") or old.get("max_steps")
    if not old_span or old_span == cfg.decay_steps():
        return []
    t = cfg.train

    def rate(span: int, lr: float, min_lr: float, warmup: int, schedule: str,
             fraction: float) -> float:
        return lr_at(step, lr=lr, min_lr=min_lr, warmup_steps=warmup, max_steps=span,
                     schedule=schedule, decay_fraction=fraction)

    before = rate(old_span, old.get("lr", t.lr), old.get("min_lr", t.min_lr),
                  old.get("warmup_steps", t.warmup_steps),
                  old.get("lr_schedule", LEGACY["train"]["lr_schedule"]),
                  old.get("decay_fraction", 0.3))
    now = rate(cfg.decay_steps(), t.lr, t.min_lr, t.warmup_steps, t.lr_schedule,
               t.decay_fraction)
    if abs(now - before) <= 1e-3 * max(before, now):
        return []
    jump = "up" if now > before else "down"
    return [f"the {t.lr_schedule} schedule now spans {cfg.decay_steps()} steps instead of {old_span}: "
            f"at step {step + 1} the learning rate is {now:.2e} where the old schedule had "
            f"{before:.2e} (a jump {jump}). To go on at the old rate instead, resume with "
            f"`--lr-decay-steps {old_span}`; to extend a run smoothly, give its first part "
            f"the final length (`--lr-decay-steps N` from the start)"]


def _batch(cfg: Config, old: dict, old_world, world: int | None) -> list[str]:
    """The global batch, when resuming on another number of ranks changes it."""
    if world is None or not isinstance(old_world, int) or old_world == world:
        return []
    t = cfg.train
    before = old.get("micro_batch_size", t.micro_batch_size) * \
        old.get("grad_accum", t.grad_accum) * old_world
    now = t.micro_batch_size * t.grad_accum * world
    keep = (f"resume with `--grad-accum {before // (t.micro_batch_size * world)}`"
            if before % (t.micro_batch_size * world) == 0 else None)
    return batch_change(before, now, old_world, world, "sequences per step", keep)
