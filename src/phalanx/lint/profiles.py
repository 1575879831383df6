"""Named rule selections for `phalanx lint --select NAME`: `seeds`, every rule that finds
one of the field guides' pitfalls (shared/seeds/), the opt-in ones among them included —
what a user runs the linter for when moving a script to many GPUs. docs/lint-seeds.md
says which selection finds each pitfall; tests/unit/test_lint_seed_pitfalls.py plants
each one and checks it is found."""

from __future__ import annotations

# (the pitfall as the guides name it, the rule that finds it)
SEED_PITFALLS = (
    ("nn.DataParallel instead of DDP", "PX101"),
    ("DDP wrapping a model that is not on its device yet", "PX102"),
    ("no torch.cuda.set_device before DDP", "PX104"),
    ("a DataLoader without a DistributedSampler", "PX201"),
    ("`sampler=` with `shuffle=True`", "PX202"),
    ("DistributedSampler without set_epoch", "PX203"),
    ("a collective reached on rank 0 only", "PX301"),
    ("gradient accumulation without no_sync", "PX401"),
    ("an accumulated loss not divided by the micro-steps", "PX404"),
    ("torch.load without map_location", "PX501"),
    ("torch.load with unsafe unpickling (`weights_only=False`)", "PX502"),
    ("the DDP `module.` prefix in a saved state dict", "PX503"),
    ("torch.save on every rank", "PX504"),
    ("gradient clipping before `scaler.unscale_`", "PX601"),
    ("a GradScaler with bf16", "PX602"),
    ("the deprecated torch.cuda.amp API", "PX603"),
    ("a hard-coded MASTER_PORT", "PX701"),
    ("no destroy_process_group", "PX702"),
    ("find_unused_parameters=True left on", "PX703"),
    ("BatchNorm without SyncBatchNorm", "PX704"),
    ("a loss printed on rank 0 without a reduction", "PX705"),
    ("a `timeout` argument to DDP (it has none)", "PX706"),
    ("the global rank used as a GPU index", "PX801"),
)
PROFILES = {"SEEDS": frozenset(code for _, code in SEED_PITFALLS)}
