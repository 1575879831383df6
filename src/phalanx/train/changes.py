"""What changed between a checkpoint's run and the run resuming it: a different model
shape is refused; other changes are allowed and said in the `resumed from …; changed:`
line — with what they do to the training when that is not obvious (the learning rate at
the resume step under a re-sized schedule, the global batch on another number of ranks)
and how to avoid it."""

from __future__ import annotations

from pathlib import Path

from phalanx.config.sections import Config
from phalanx.errors import UserError
from phalanx.train.schedule import lr_at

SHAPE_FIELDS = ("n_layer", "n_head", "n_embd", "block_size", "bias")
LOGGED_FIELDS = ("lr", "min_lr", "max_steps", "lr_decay_steps", "warmup_steps",
                 "micro_batch_size", "grad_accum", "precision", "seed")


def check_compatible(cfg: Config, meta: dict, path: Path, world: int | None = None) -> list[str]:
    """Refuse a different model shape (naming the fields); return the changes allowed.
    `meta`: the checkpoint's sidecar meta; `world`: the data-parallel ranks resuming it
    (None: not known yet, before the launch)."""
    saved = meta.get("config", {})
    old_model, old_train = saved.get("model", {}), saved.get("train", {})
    differ = [f"--{k.replace('_', '-')} {old_model.get(k)} → {getattr(cfg.model, k)}"
              for k in SHAPE_FIELDS if old_model.get(k) != getattr(cfg.model, k)]
    if differ:
        raise UserError(f"checkpoint `{path}` was written for another model shape: "
                        f"{', '.join(differ)}. Resume with the same model flags, or start "
                        f"fresh with `--resume never` (or another `--out`).")
    changes = [f"--{k.replace('_', '-')} {old_train.get(k)} → {getattr(cfg.train, k)}"
               for k in LOGGED_FIELDS if k in old_train and old_train[k] != getattr(cfg.train, k)]
    step = int(meta.get("train_state", {}).get("step", 0))
    return changes + _schedule(cfg, old_train, step) + _batch(cfg, old_train,
                                                              meta.get("world_size"), world)


def _schedule(cfg: Config, old: dict, step: int) -> list[str]:
    """The learning rate at the resume step, when the schedule's length changed."""
    old_span = old.get("lr_decay_steps") or old.get("max_steps")
    if not old_span or old_span == cfg.decay_steps():
        return []
    t = cfg.train

    def rate(span: int, lr: float, min_lr: float, warmup: int) -> float:
        return lr_at(step, lr=lr, min_lr=min_lr, warmup_steps=warmup, max_steps=span)

    before = rate(old_span, old.get("lr", t.lr), old.get("min_lr", t.min_lr),
                  old.get("warmup_steps", t.warmup_steps))
    now = rate(cfg.decay_steps(), t.lr, t.min_lr, t.warmup_steps)
    if abs(now - before) <= 1e-3 * max(before, now):
        return []
    jump = "up" if now > before else "down"
    return [f"the cosine schedule now spans {cfg.decay_steps()} steps instead of {old_span}: "
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
    if before == now:
        return []
    fix = ""
    if before % (t.micro_batch_size * world) == 0:
        fix = (f"; to keep {before}, resume with `--grad-accum "
               f"{before // (t.micro_batch_size * world)}`")
    return [f"the global batch is {now} sequences per step instead of {before} "
            f"({old_world} → {world} ranks){fix}"]
