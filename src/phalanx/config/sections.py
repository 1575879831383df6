"""Typed configuration: one dataclass per section, validated once.

Every field carries its command-line flag and help in `metadata`, so the CLI, the TOML
file and the error messages all speak of the same names. Precedence, lowest first:
field defaults < model preset < TOML file (`--config`) < command-line flags.
This module does not import torch, so `phalanx --help` and config errors are instant.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from phalanx.config.data_spec import BIN_DTYPES, parse_spec
from phalanx.config.dist import BACKENDS, NCCL_PRESETS, STRATEGIES, DistConfig, endpoint
from phalanx.config.fields import (
    INT64,
    MAX_PROCS,
    MAX_TIMEOUT_S,
    _check_values,
    _positive,
    flag_of,
    opt,
    step_range,
    tracker_list,
)
from phalanx.config.layout import minigpt_tp_refusal, trainer_pipeline_refusal
from phalanx.errors import UserError

__all__ = ["BACKENDS", "NCCL_PRESETS", "STRATEGIES", "DistConfig", "endpoint", "flag_of",
           "opt", "MAX_PROCS", "MAX_TIMEOUT_S", "PRECISIONS", "PRESETS", "SECTIONS", "Config",
           "ModelConfig", "DataConfig", "TrainConfig", "build_config", "from_dict"]

PRECISIONS = ("fp32", "bf16", "fp16")

# Model presets: `tiny` is sized to learn something on two CPU cores in ~3 minutes;
# `gpt2-124m` is GPT-2 small's architecture (12 layers, 12 heads, 768 wide, 1024 context,
# biases, tied head, learned positions, GELU: the levers the others default to are off): with GPT-2's vocabulary of 50,257 tokens, 124,439,808
# parameters, as GPT-2's own.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, bias=True,
                      rope=False, activation="gelu", tie_embeddings=True),
}
# What a preset sets outside `[model]`, per section (below the TOML file and the flags, as
# the model fields): `gpt2-124m` trains a BPE of GPT-2's vocabulary size unless
# `--tokenizer` says otherwise (with 256 bytes it would have 86 M parameters, not 124 M).
PRESET_SECTIONS: dict[str, dict[str, dict[str, Any]]] = {
    "gpt2-124m": {"data": {"tokenizer": "bpe:50257"}},
}


@dataclass(kw_only=True)
class ModelConfig:
    preset: str = opt("tiny", "Model size preset; the flags below override its fields.",
                      choices=tuple(PRESETS))
    n_layer: int = opt(4, "Number of transformer blocks.")
    n_head: int = opt(4, "Attention heads per block; must divide --n-embd.")
    n_embd: int = opt(128, "Embedding width.")
    block_size: int = opt(64, "Context length in tokens (bytes).")
    dropout: float = opt(0.0, "Dropout probability (0 keeps runs exactly reproducible).")
    bias: bool = opt(False, "Use biases in Linear and LayerNorm layers.")
    activation_checkpointing: bool = opt(False, "Recompute block activations in backward "
                                                "to save memory.")
    rope: bool = opt(True, "Rotary position embeddings instead of a learned position table "
                           "(--no-rope: GPT-2's learned table).")
    qk_norm: bool = opt(False, "RMS-normalise each head's queries and keys (QK-norm).")
    activation: str = opt("relu2", "MLP nonlinearity: ReLU² (the speedrun's) or GELU (GPT-2).",
                          choices=("gelu", "relu2"))
    tie_embeddings: bool = opt(False, "Share the output head's weight with the token "
                                      "embedding (GPT-2); default: a separate head.")
    logit_softcap: float = opt(0.0, "Soft-cap the logits: c·tanh(logits / c) (0: off).")
    factory: str | None = opt(None, "Your model instead of MiniGPT: a function `factory("
                                    "vocab_size=, block_size=)` (keywords it accepts) that "
                                    "returns an nn.Module mapping token ids (B, T) to logits "
                                    "(B, T, vocab); see docs/own-script.md (default: MiniGPT, "
                                    "shaped by the flags above).",
                              flag="--model", metavar="PKG.MODULE:FACTORY")
    init_from: str | None = opt(None, "Start from the weights of a local Hugging Face "
                                      "save_pretrained directory (--model's class; without "
                                      "--model a GPT-2 one, MiniGPT in GPT-2's shape), each "
                                      "rank reading only what it holds (a fresh start only: "
                                      "a resumed run continues from its checkpoint).",
                                metavar="DIR")

    def __post_init__(self) -> None:
        _check_values(self)
        _positive(self, "n_layer", "n_head", "n_embd", "block_size")
        if self.init_from is not None:
            _check_init_from(self.init_from, self)
        if self.factory is not None:
            module, _, name = self.factory.partition(":")
            if not all(part.isidentifier() for part in module.split(".")) or \
                    not name.isidentifier():
                raise UserError(f"`--model {self.factory}`: expected `package.module:factory` "
                                f"(a module importable from the current directory or "
                                f"PYTHONPATH, a colon, and the name of a function in it).")
            if self.activation_checkpointing or self.dropout:
                raise UserError(f"`--activation-checkpointing` and `--dropout` are MiniGPT's; "
                                f"`--model {self.factory}` builds its own model: leave them out "
                                f"and put dropout or torch.utils.checkpoint in your module.")
        if self.n_embd % self.n_head:
            raise UserError(
                f"`--n-embd` ({self.n_embd}) must be divisible by `--n-head` ({self.n_head}): "
                f"each head gets n_embd / n_head channels. Try `--n-head "
                f"{_divisor_near(self.n_embd, self.n_head)}` or `--n-embd "
                f"{self.n_head * max(1, round(self.n_embd / self.n_head))}`.")
        if self.logit_softcap < 0:
            raise UserError(f"`--logit-softcap` must be >= 0 (0: off), got {self.logit_softcap}.")
        if self.rope and (self.n_embd // self.n_head) % 2:
            raise UserError(f"`--rope` rotates pairs of channels: the head size "
                            f"{self.n_embd // self.n_head} (--n-embd / --n-head) must be even.")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"`--dropout` must be in [0, 1), got {self.dropout}.")


# MiniGPT's fields that make it GPT-2's architecture, and the flag that sets each
# (checkpoint/gpt2.py maps its tensors to a GPT-2 checkpoint's)
GPT2_SHAPE = {"bias": (True, "--bias"), "rope": (False, "--no-rope"),
              "activation": ("gelu", "--activation gelu"),
              "tie_embeddings": (True, "--tie-embeddings"),
              "qk_norm": (False, "--no-qk-norm"), "logit_softcap": (0.0, "--logit-softcap 0")}


def refuse_unless_gpt2(model: Any, what: str) -> None:
    """A UserError naming the flags when MiniGPT's `model` config (ModelConfig or
    GPTConfig) is not GPT-2's architecture."""
    off = [flag for field, (want, flag) in GPT2_SHAPE.items()
           if getattr(model, field) != want]
    if off:
        raise UserError(f"{what} needs MiniGPT in GPT-2's architecture, whose tensors a GPT-2 "
                        f"checkpoint has; this one differs: it needs {' '.join(off)} "
                        f"(`--preset gpt2-124m` sets them all).")


def _check_init_from(path: str, model: ModelConfig) -> None:
    """`--init-from` with `--model`: that class's names; without, MiniGPT in GPT-2's shape
    (the directory itself is read, and checked, at a fresh start only: a resumed run or
    an export never reads it, and may run elsewhere)."""
    if model.factory is None:
        refuse_unless_gpt2(model, f"`--init-from {path}` without `--model`")


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))


@dataclass(kw_only=True)
class DataConfig:
    path: str | None = opt(None, "What to train on: a text file or folder (files ending "
                                 "in .jsonl are JSON Lines, .parquet/.arrow tables), a "
                                 "Hugging Face dataset saved with save_to_disk, or a folder "
                                 "with nanoGPT's train.bin and val.bin (token ids). Default: "
                                 "the Python standard library's source, embedded with the "
                                 "interpreter. See docs/data.md.", flag="--data",
                           metavar="PATH")
    tokenizer: str = opt("auto", "auto: bpe:4096 for the embedded corpus and for --data of "
                                 "1 MiB or more, bytes for less (and the ids of train.bin/"
                                 "val.bin as they are); bytes (256 ids, one per "
                                 "byte); bpe[:VOCAB]: a byte-level BPE trained on the "
                                 "training split and cached, VOCAB 257..65536 (default "
                                 "4096); or the path of a Hugging Face tokenizer.json.",
                         metavar="{auto,bytes,bpe[:VOCAB],PATH}")
    text_field: str = opt("text", "The field holding the text in JSON Lines records and "
                                  "the column in Parquet/Arrow tables and datasets.",
                          metavar="NAME")
    bin_dtype: str = opt("uint16", "The dtype of train.bin/val.bin token ids (nanoGPT "
                                   "writes uint16).", choices=BIN_DTYPES)
    cache_dir: str | None = opt(None, "Where tokenized data is cached "
                                      "(default: $XDG_CACHE_HOME/phalanx or ~/.cache/phalanx).",
                                metavar="DIR")
    val_fraction: float = opt(0.05, "Fraction of the text held out for validation.")

    def __post_init__(self) -> None:
        _check_values(self)
        if not 0.0 < self.val_fraction < 0.5:
            raise UserError(f"`--val-fraction` must be in (0, 0.5), got {self.val_fraction}.")
        parse_spec(self.tokenizer)  # a bad `bpe:VOCAB` is refused here; a file when read


@dataclass(kw_only=True)
class TrainConfig:
    out: str = opt("runs/default", "Run directory: metrics, plots, sample and weights go here.",
                   metavar="DIR")
    max_steps: int = opt(1000, "Optimizer steps to train for.")
    micro_batch_size: int = opt(8, "Sequences per rank per micro-step.")
    grad_accum: int = opt(1, "Micro-steps accumulated per optimizer step.")
    lr: float = opt(2e-3, "Peak learning rate (AdamW).")
    min_lr: float = opt(2e-4, "Learning rate at the end of the decay (cosine or wsd).")
    warmup_steps: int = opt(50, "Linear warm-up steps.")
    lr_schedule: str = opt("wsd", "After the warm-up: cosine decay to --min-lr, or wsd "
                                     "(warm-up/stable/decay: the peak held, then a linear "
                                     "decay over the last --decay-fraction of the steps).",
                           choices=("cosine", "wsd"))
    decay_fraction: float = opt(0.3, "wsd: the fraction of the steps spent decaying.")
    lr_decay_steps: int = opt(0, "Length of the schedule in steps (0: --max-steps). "
                                 "Set it when a run will later be extended with a larger "
                                 "--max-steps, so the steps already taken keep their rates.")
    optimizer: str = opt("muon", "adamw; or muon: Muon for the hidden weight matrices "
                                  "(orthogonalised momentum, at --muon-lr), AdamW for "
                                  "embeddings, head, norms and biases. Correct under every "
                                  "strategy (docs/strategies.md).",
                         choices=("adamw", "muon"))
    muon_lr: float = opt(0.02, "Muon's peak learning rate (it follows the same schedule).")
    weight_decay: float = opt(0.1, "AdamW weight decay (not applied to biases and norms).")
    beta1: float = opt(0.9, "AdamW beta1.")
    beta2: float = opt(0.99, "AdamW beta2.")
    grad_clip: float = opt(1.0, "Clip the global gradient norm to this (0 disables).")
    on_nan: str = opt("skip", "A non-finite loss or gradient on any rank: skip the step on "
                              "every rank (the replicas stay identical, the batch is passed "
                              "over); rollback: reload the newest committed checkpoint and "
                              "go on past the offending batch (skip until there is one); or "
                              "stop the run.", choices=("skip", "rollback", "stop"))
    nan_patience: int = opt(20, "Stop after this many non-finite steps in a row.")
    spike_factor: float = opt(2.0, "Warn when a step's loss is above this many times the "
                                   "median of the last 50 steps' (0: never).")
    precision: str = opt("fp32", "Numeric precision; bf16/fp16 use torch.autocast "
                                 "(fp16 adds a GradScaler).", choices=PRECISIONS)
    eval_every: int = opt(500, "Evaluate on the validation split every N steps and at the "
                               "end; 0: never (no validation loss).")
    eval_batches: int = opt(32, "Validation micro-batches per rank per evaluation.")
    log_every: int = opt(50, "Write a metrics line every N steps.")
    seed: int = opt(1337, "Seed for model init, data order and dropout.")
    compile: bool = opt(False, "Wrap the model with torch.compile (slow to start on CPU).")
    sample_tokens: int = opt(300, "Tokens of text to sample from the model at the end "
                                  "(0: none).")
    checkpoint_every: int = opt(500, "Commit a checkpoint every N steps (and at the end); "
                                     "0: only at the end.")
    keep_checkpoints: int = opt(3, "Committed checkpoints to keep (the newest K).")
    async_checkpoint: bool = opt(False, "Write checkpoints in the background (DCP async "
                                        "save): training stalls only for the copy to memory.")
    resume: str = opt("auto", "auto: continue from the newest valid checkpoint in --out; "
                              "never: start fresh; or a checkpoint / run directory.",
                      metavar="{auto,never,PATH}")
    profile_steps: str | None = opt(None, "Profile optimizer steps A to B (torch.profiler): "
                                          "each rank's trace in OUT/profile/rank-R.json.gz, "
                                          "a per-rank summary in the run report. E.g. 5-7.",
                                    metavar="A-B")
    memory_history: int = opt(0, "CUDA: record the last N allocator events from the start; "
                                 "an out-of-memory error then writes OUT/memory-snapshot-"
                                 "rank-R.pickle (view it at pytorch.org/memory_viz). 0: off.",
                              metavar="N")
    trackers: str | None = opt(None, "Experiment trackers to log to besides metrics.jsonl and "
                            "TensorBoard, comma-separated: wandb (honours WANDB_MODE, "
                            "WANDB_DIR, WANDB_PROJECT), mlflow (MLFLOW_TRACKING_URI, "
                            "MLFLOW_EXPERIMENT_NAME). Needs phalanx[trackers].",
                        flag="--tracker", metavar="NAMES")

    def __post_init__(self) -> None:
        _check_values(self)
        _positive(self, "max_steps", "micro_batch_size", "grad_accum", "lr", "muon_lr",
                  "eval_batches", "log_every", "nan_patience")
        if not 0 <= self.seed < INT64:
            raise UserError(f"`--seed` must be in [0, 2**63 - 1], got {self.seed}.")
        if self.sample_tokens < 0:
            raise UserError(f"`--sample-tokens` must be >= 0, got {self.sample_tokens}.")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"`--{name}` must be in [0, 1), got {getattr(self, name)}.")
        if self.spike_factor != 0 and not self.spike_factor > 1:
            raise UserError(f"`--spike-factor` must be 0 (off) or above 1, got "
                            f"{self.spike_factor}.")
        if self.weight_decay < 0:
            raise UserError(f"`--weight-decay` must be >= 0, got {self.weight_decay}.")
        if self.warmup_steps < 0 or self.min_lr < 0 or self.grad_clip < 0:
            raise UserError("`--warmup-steps`, `--min-lr` and `--grad-clip` must not be negative.")
        if self.memory_history < 0:
            raise UserError(f"`--memory-history` must be 0 (off) or the number of allocator "
                            f"events to keep (e.g. 100000), not {self.memory_history}.")
        if self.keep_checkpoints < 1:
            raise UserError(f"`--keep-checkpoints` must be at least 1, got "
                            f"{self.keep_checkpoints}: the newest checkpoint is what resume uses.")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise UserError(f"`--decay-fraction` must be in (0, 1], got {self.decay_fraction}.")
        if self.lr_decay_steps < 0:
            raise UserError(f"`--lr-decay-steps` must be >= 0, got {self.lr_decay_steps}.")
        for name in ("checkpoint_every", "eval_every"):  # 0: a cadence turned off
            if getattr(self, name) < 0:
                raise UserError(f"`--{name.replace('_', '-')}` must be >= 0 (0: off), got "
                                f"{getattr(self, name)}.")
        if self.min_lr > self.lr:
            raise UserError(f"`--min-lr` ({self.min_lr}) must not exceed `--lr` ({self.lr}).")
        if self.trackers:
            tracker_list(self.trackers)
        if self.profile_steps is not None:
            first, _ = step_range(self.profile_steps, "--profile-steps")
            if first > self.max_steps:
                raise UserError(f"`--profile-steps {self.profile_steps}` starts after the "
                                f"run's last step (`--max-steps {self.max_steps}`): nothing "
                                f"would be profiled. Choose steps from 1 to {self.max_steps}.")



SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "dist": DistConfig}


@dataclass(kw_only=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def __post_init__(self) -> None:
        why = trainer_pipeline_refusal(self)
        if why is not None:
            raise UserError(f"`--pp {self.dist.pp}`: {why}.")
        tp, m = self.dist.tp, self.model
        if m.factory is None and isinstance(tp, int) and tp > 1:  # (a --model: its plan's)
            why = minigpt_tp_refusal(m.n_head, tp)
            if why:
                raise UserError(f"`--tp {tp}`: {why}. Choose a --tp that fits, or leave it "
                                f"out.")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def with_dist(self, **changes: Any) -> Config:
        """A what-if copy with some `dist` fields changed, for the planner: not validated
        (`dataclasses.replace` would be, and would refuse e.g. a `pp` this config's own
        flags do not allow, which is what a candidate is checked for)."""
        changed = copy.copy(self)
        changed.dist = copy.copy(self.dist)
        for name, value in changes.items():
            if not hasattr(changed.dist, name):
                raise AttributeError(f"DistConfig has no field {name!r}")
            setattr(changed.dist, name, value)
        return changed

    def decay_steps(self) -> int:
        """The cosine schedule's length: `--lr-decay-steps`, or `--max-steps` when 0."""
        return self.train.lr_decay_steps or self.train.max_steps

    def tokens_per_step(self, world_size: int) -> int:
        t = self.train
        return t.micro_batch_size * t.grad_accum * world_size * self.model.block_size


def build_config(overrides: dict[str, dict[str, Any]]) -> Config:
    """Build a validated `Config` from per-section overrides (TOML, then CLI, merged).

    The model preset supplies defaults for the model fields that are not overridden, and
    for the other sections' fields it names (`PRESET_SECTIONS`: `gpt2-124m`'s tokenizer).
    The built config holds every value, so `from_dict` (a checkpoint's sidecar, a resumed
    run) rebuilds it without the preset.
    """
    model = dict(overrides.get("model", {}))
    preset = model.get("preset", "tiny")
    if preset not in PRESETS:
        raise UserError(f"unknown model preset `{preset}`; expected one of: "
                        f"{', '.join(PRESETS)} (`--preset`).")
    merged = {name: {**PRESET_SECTIONS.get(preset, {}).get(name, {}),
                     **overrides.get(name, {})} for name in SECTIONS}
    merged["model"] = {**PRESETS[preset], **model}
    return Config(**{name: cls(**merged[name]) for name, cls in SECTIONS.items()})


# What a configuration saved before a field existed meant by its absence (a checkpoint of
# 0.1's recipe: bytes, GPT-2's architecture, AdamW on a cosine) — not today's defaults.
LEGACY: dict[str, dict[str, Any]] = {
    "model": {"rope": False, "qk_norm": False, "activation": "gelu", "tie_embeddings": True,
              "logit_softcap": 0.0},
    "data": {"tokenizer": "bytes"},
    "train": {"optimizer": "adamw", "lr_schedule": "cosine"},
}


def from_dict(data: dict[str, dict[str, Any]], source: str = "the saved configuration") -> Config:
    """Rebuild a `Config` written by `Config.to_dict` (e.g. a checkpoint's sidecar; a
    field it predates takes its `LEGACY` meaning); anything else in it (unknown keys,
    wrong types) is a UserError naming `source`."""
    if not isinstance(data, dict):
        raise UserError(f"{source} is not a table of sections.")
    sections = {}
    for name, cls in SECTIONS.items():
        values = data.get(name, {})
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(values, dict) or set(values) - known:
            bad = sorted(set(values) - known)[:3] if isinstance(values, dict) else values
            raise UserError(f"{source} has an invalid `{name}` section ({bad!r} is not one of "
                            f"its keys); it was not written by this version of Phalanx.")
        try:
            sections[name] = cls(**{**LEGACY.get(name, {}), **values})
        except (TypeError, ValueError) as exc:
            raise UserError(f"{source}: `{name}` cannot be used ({exc}).") from None
    return Config(**sections)
