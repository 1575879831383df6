"""Typed configuration: one dataclass per section, validated once.

Every field carries its command-line flag and help in `metadata`, so the CLI, the TOML
file and the error messages all speak of the same names. Precedence, lowest first:
field defaults < model preset < TOML file (`--config`) < command-line flags.
This module does not import torch, so `phalanx --help` and config errors are instant.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from phalanx.config.nccl import PRESET_NAMES
from phalanx.config.strategy import GRAD_SYNC, SPECS, choose, foreign_options
from phalanx.errors import UserError

PRECISIONS = ("fp32", "bf16", "fp16")
STRATEGIES = tuple(SPECS)
BACKENDS = ("auto", "gloo", "nccl")
NCCL_PRESETS = PRESET_NAMES

# Model presets: `tiny` is sized to learn something on two CPU cores in ~3 minutes;
# `gpt2-124m` is GPT-2 small (12 layers, 12 heads, 768 wide, 1024 context).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=64),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2-124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}


def opt(default: Any, help: str, flag: str | None = None, choices: tuple | None = None,
        metavar: str | None = None) -> Any:
    """A config field: its default, its help text, and optionally flag, choices, metavar."""
    meta = {"help": help, "flag": flag, "choices": choices, "metavar": metavar}
    return field(default=default, metadata=meta)


def flag_of(f: dataclasses.Field) -> str:
    """The command-line spelling of a field: `n_layer` → `--n-layer`."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


INT64 = 1 << 63
MAX_TIMEOUT_S = 30 * 24 * 3600.0  # a collective that may wait a month is a mistake
MAX_PROCS = 4096


def _field(section: Any, name: str) -> dataclasses.Field:
    return {x.name: x for x in dataclasses.fields(section)}[name]


def _check_values(section: Any) -> None:
    """Every number finite and within 64 bits, every given string non-empty: one line
    naming the flag otherwise. Runs first in each section's `__post_init__`."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"`{flag_of(f)}` must be a finite number, got {value}.")
        if isinstance(value, int) and not -INT64 <= value < INT64:
            raise UserError(f"`{flag_of(f)}` {value} does not fit in 64 bits.")
        if isinstance(value, str) and not value.strip():
            raise UserError(f"`{flag_of(f)}` must not be empty; give a value or leave the "
                            f"flag out for its default.")


def _at_most(section: Any, name: str, limit: float, why: str) -> None:
    value = getattr(section, name)
    if value is not None and value > limit:
        raise UserError(f"`{flag_of(_field(section, name))}` {value:g} is more than {limit:g}: "
                        f"{why}.")


def _positive(section: Any, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if value is not None and value <= 0:
            f = _field(section, name)
            raise UserError(f"`{flag_of(f)}` must be a positive number, got {value}.")


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

    def __post_init__(self) -> None:
        _check_values(self)
        _positive(self, "n_layer", "n_head", "n_embd", "block_size")
        if self.n_embd % self.n_head:
            raise UserError(
                f"`--n-embd` ({self.n_embd}) must be divisible by `--n-head` ({self.n_head}): "
                f"each head gets n_embd / n_head channels. Try `--n-head "
                f"{_divisor_near(self.n_embd, self.n_head)}` or `--n-embd "
                f"{self.n_head * max(1, round(self.n_embd / self.n_head))}`.")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"`--dropout` must be in [0, 1), got {self.dropout}.")


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))


@dataclass(kw_only=True)
class DataConfig:
    path: str | None = opt(None, "Text file or directory of text files to train on "
                                 "(default: the Python standard library's source, "
                                 "embedded with the interpreter).", flag="--data", metavar="PATH")
    cache_dir: str | None = opt(None, "Where tokenized data is cached "
                                      "(default: $XDG_CACHE_HOME/phalanx or ~/.cache/phalanx).",
                                metavar="DIR")
    val_fraction: float = opt(0.05, "Fraction of the text held out for validation.")

    def __post_init__(self) -> None:
        _check_values(self)
        if not 0.0 < self.val_fraction < 0.5:
            raise UserError(f"`--val-fraction` must be in (0, 0.5), got {self.val_fraction}.")


@dataclass(kw_only=True)
class TrainConfig:
    out: str = opt("runs/default", "Run directory: metrics, plots, sample and weights go here.",
                   metavar="DIR")
    max_steps: int = opt(2500, "Optimizer steps to train for.")
    micro_batch_size: int = opt(8, "Sequences per rank per micro-step.")
    grad_accum: int = opt(1, "Micro-steps accumulated per optimizer step.")
    lr: float = opt(2e-3, "Peak learning rate (AdamW).")
    min_lr: float = opt(2e-4, "Learning rate at the end of the cosine decay.")
    warmup_steps: int = opt(50, "Linear warm-up steps.")
    lr_decay_steps: int = opt(0, "Length of the cosine schedule in steps (0: --max-steps). "
                                 "Set it when a run will later be extended with a larger "
                                 "--max-steps, so the steps already taken keep their rates.")
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
    eval_every: int = opt(500, "Evaluate on the validation split every N steps (and at the end).")
    eval_batches: int = opt(32, "Validation micro-batches per rank per evaluation.")
    log_every: int = opt(50, "Write a metrics line every N steps.")
    seed: int = opt(1337, "Seed for model init, data order and dropout.")
    compile: bool = opt(False, "Wrap the model with torch.compile (slow to start on CPU).")
    sample_tokens: int = opt(300, "Bytes of text to sample from the model at the end (0: none).")
    checkpoint_every: int = opt(500, "Commit a checkpoint every N steps (and at the end); "
                                     "0: only at the end.")
    keep_checkpoints: int = opt(3, "Committed checkpoints to keep (the newest K).")
    async_checkpoint: bool = opt(False, "Write checkpoints in the background (DCP async "
                                        "save): training stalls only for the copy to memory.")
    resume: str = opt("auto", "auto: continue from the newest valid checkpoint in --out; "
                              "never: start fresh; or a checkpoint / run directory.",
                      metavar="{auto,never,PATH}")

    def __post_init__(self) -> None:
        _check_values(self)
        _positive(self, "max_steps", "micro_batch_size", "grad_accum", "lr", "eval_every",
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
        if self.keep_checkpoints < 1:
            raise UserError(f"`--keep-checkpoints` must be at least 1, got "
                            f"{self.keep_checkpoints}: the newest checkpoint is what resume uses.")
        if self.lr_decay_steps < 0:
            raise UserError(f"`--lr-decay-steps` must be >= 0, got {self.lr_decay_steps}.")
        if self.checkpoint_every < 0:
            raise UserError(f"`--checkpoint-every` must be >= 0, got {self.checkpoint_every}.")
        if self.min_lr > self.lr:
            raise UserError(f"`--min-lr` ({self.min_lr}) must not exceed `--lr` ({self.lr}).")


@dataclass(kw_only=True)
class DistConfig:
    nproc_per_node: int | None = opt(None, "Worker processes on this machine (default: one "
                                           "per visible GPU, else one per usable CPU core).")
    strategy: str | None = opt(None, "Parallelism: " + "; ".join(
        f"{s.name}: {s.summary}" for s in SPECS.values()) + ". Default: ddp when more than "
        "one rank, else single. See docs/strategies.md.", choices=STRATEGIES)
    backend: str = opt("auto", "Process-group backend (auto: nccl on CUDA, gloo on CPU).",
                       choices=BACKENDS)
    threads_per_rank: int | None = opt(None, "torch threads per rank (default: usable cores "
                                             "divided by ranks on this node).")
    bucket_cap_mb: float = opt(25.0, "DDP gradient bucket size in MiB.")
    gradient_as_bucket_view: bool = opt(True, "DDP: gradients are views into the "
                                              "all-reduce buckets (saves a copy).")
    static_graph: bool = opt(True, "DDP: declare the graph static — the same parameters "
                                   "take part every step, as in MiniGPT. Used only with "
                                   "--grad-accum 1. `phalanx bench --defaults` measures it "
                                   "against torch's default (2 CPU gloo ranks: no difference "
                                   "beyond noise).")
    find_unused_parameters: bool = opt(False, "DDP: search for parameters without "
                                              "gradient every step (costly; off by default).")
    sync_batchnorm: bool = opt(False, "Convert BatchNorm to SyncBatchNorm before wrapping "
                                      "(CUDA only).")
    fsdp_reshard_after_forward: bool = opt(True, "fsdp: free gathered parameters after each "
                                                 "block's forward and gather them again for "
                                                 "backward (ZeRO-3); --no-…: keep them "
                                                 "(ZeRO-2-like, one all-gather fewer, more "
                                                 "memory).")
    fsdp_bf16_reduce: bool = opt(False, "fsdp with --precision bf16: reduce-scatter gradients "
                                        "in bf16 instead of fp32 (half the bytes, less exact).")
    fsdp_cpu_offload: bool = opt(False, "fsdp: keep parameter shards and optimizer state in "
                                        "CPU memory between uses (CUDA only).")
    fsdp_grad_sync: str = opt("every", "fsdp with --grad-accum: `every` reduce-scatters on "
                                       "every micro-step (gradients stay sharded: least "
                                       "memory); `last` skips until the last micro-step "
                                       "(less communication, but each rank holds the full "
                                       "unsharded gradients). See docs/strategies.md.",
                              choices=GRAD_SYNC)
    nnodes: str = opt("1", "Machines in the job: N, or MIN:MAX to let it run on between MIN "
                           "and MAX (torch's elastic agent, c10d rendezvous). The same command "
                           "runs on every machine; needs --rdzv-endpoint when more than one.",
                      metavar="N|MIN:MAX")
    node_rank: int | None = opt(None, "This machine's index (0 .. nnodes-1), for the output "
                                      "and to say that node 0 hosts the rendezvous (default: "
                                      "the machine whose address is the endpoint's).")
    rdzv_endpoint: str | None = opt(None, "HOST:PORT where the machines meet: an address of "
                                          "node 0 that every node can reach.",
                                    metavar="HOST:PORT")
    rdzv_id: str = opt("phalanx", "The job's rendezvous id: the same on every machine, "
                                  "different for two jobs sharing an endpoint.", metavar="ID")
    rdzv_timeout_s: float = opt(300.0, "How long the machines wait for each other to join.")
    timeout_s: float = opt(600.0, "Collective timeout in seconds.")
    max_restarts: int = opt(0, "Times torch's elastic agent restarts failed workers.")
    hang_timeout_s: float = opt(300.0, "Hang watchdog: when no rank progresses for this "
                                       "many seconds, report where each rank waits and exit "
                                       "(code 3). 0: off.")
    debug_collectives: bool = opt(False, "Verify every collective's op, shapes and dtypes "
                                         "across ranks (TORCH_DISTRIBUTED_DEBUG=DETAIL, "
                                         "slower) and explain a mismatch.")
    nccl_preset: str | None = opt(None, "Set a named group of NCCL variables for the "
                                        "workers, each printed with what it does: "
                                        "ethernet, infiniband or debug (see "
                                        "docs/multinode.md). Variables you set are kept.",
                                  choices=NCCL_PRESETS)
    tee_ranks: bool = opt(False, "Show every rank's output on the console. By default each "
                                 "rank writes to its own log (train: OUT/logs/rank-R.log) and "
                                 "the console shows rank 0's progress and one line per "
                                 "failure, with the log that holds the traceback.")
    check_consistency_every: int = opt(0, "Every N steps, check that all replicas' "
                                          "parameters and buffers are bitwise identical "
                                          "(0: never).")
    straggler_every: int = opt(200, "Every N steps, compare the ranks' data + forward times "
                                   "and name a rank persistently 1.5× slower than the others "
                                   "(0: never).")

    def __post_init__(self) -> None:
        _check_values(self)
        _positive(self, "nproc_per_node", "threads_per_rank", "bucket_cap_mb", "timeout_s")
        _at_most(self, "timeout_s", MAX_TIMEOUT_S, "a stuck collective would wait that long")
        _at_most(self, "nproc_per_node", MAX_PROCS, "that many processes on one machine is "
                 "a typo; one per GPU or CPU core is the norm")
        _at_most(self, "threads_per_rank", MAX_PROCS, "more threads than any machine's cores")
        for name in ("max_restarts", "hang_timeout_s", "check_consistency_every",
                     "straggler_every"):
            if getattr(self, name) < 0:
                raise UserError(f"`--{name.replace('_', '-')}` must be >= 0, got "
                                f"{getattr(self, name)}.")
        _positive(self, "rdzv_timeout_s")
        _at_most(self, "rdzv_timeout_s", MAX_TIMEOUT_S, "the machines would wait that long")
        low, high = self.node_range()
        if high > 1 and not self.rdzv_endpoint:
            raise UserError(f"`--nnodes {self.nnodes}` needs `--rdzv-endpoint HOST:PORT`: an "
                            f"address of node 0 that every machine can reach, the same on all.")
        if self.node_rank is not None and not 0 <= self.node_rank < high:
            raise UserError(f"`--node-rank` {self.node_rank} must be in 0 .. {high - 1} with "
                            f"`--nnodes {self.nnodes}`.")
        if self.rdzv_endpoint:
            endpoint(self.rdzv_endpoint)
        # before launch the world is known only from --nproc-per-node (auto: likely several
        # ranks, so ddp); only the name is read here, the options are the worker's
        chosen = choose(self, self.nproc_per_node or 2, grad_accum=1).name
        defaults = SimpleNamespace(**{f.name: f.default for f in dataclasses.fields(self)})
        foreign = foreign_options(self, chosen, defaults)
        if foreign:
            f = _field(self, foreign[0])
            owners = [s.name for s in SPECS.values() if f.name.startswith(s.flag_prefix)
                      and s.flag_prefix]
            raise UserError(f"`{flag_of(f)}` is an option of `--strategy "
                            f"{'/'.join(owners) or 'ddp/zero'}`, and this run uses "
                            f"`{chosen}`: it would have no effect. Drop it, or choose that "
                            f"strategy.")
        if self.hang_timeout_s >= self.timeout_s:
            raise UserError(f"`--hang-timeout-s` {self.hang_timeout_s:g} must be shorter than "
                            f"`--timeout-s` {self.timeout_s:g}: the collective timeout would "
                            f"fire first and the watchdog never report. Lower it (or 0: off).")


    def node_range(self) -> tuple[int, int]:
        """(min, max) machines from `--nnodes N` or `MIN:MAX`."""
        parts = self.nnodes.split(":")
        if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
            raise UserError(f"`--nnodes {self.nnodes}` must be N or MIN:MAX (whole numbers), "
                            f"e.g. `--nnodes 2` or `--nnodes 1:4`.")
        low, high = int(parts[0]), int(parts[-1])
        if not 1 <= low <= high <= MAX_PROCS:
            raise UserError(f"`--nnodes {self.nnodes}` must satisfy 1 <= MIN <= MAX <= "
                            f"{MAX_PROCS}.")
        return low, high


def endpoint(text: str) -> tuple[str, int]:
    """HOST:PORT ([v6]:PORT) → (host, port), or a UserError naming `--rdzv-endpoint`."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(f"`--rdzv-endpoint {text}` must be HOST:PORT with a port in 1..65535, "
                        f"e.g. `--rdzv-endpoint 10.0.0.1:29400`.")
    return host, int(port)


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "dist": DistConfig}


@dataclass(kw_only=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def decay_steps(self) -> int:
        """The cosine schedule's length: `--lr-decay-steps`, or `--max-steps` when 0."""
        return self.train.lr_decay_steps or self.train.max_steps

    def tokens_per_step(self, world_size: int) -> int:
        t = self.train
        return t.micro_batch_size * t.grad_accum * world_size * self.model.block_size


def build_config(overrides: dict[str, dict[str, Any]]) -> Config:
    """Build a validated `Config` from per-section overrides (TOML, then CLI, merged).

    The model preset supplies defaults for the model fields that are not overridden.
    """
    model = dict(overrides.get("model", {}))
    preset = model.get("preset", "tiny")
    if preset not in PRESETS:
        raise UserError(f"unknown model preset `{preset}`; expected one of: "
                        f"{', '.join(PRESETS)} (`--preset`).")
    model = {**PRESETS[preset], **model}
    sections = {name: cls(**(model if name == "model" else overrides.get(name, {})))
                for name, cls in SECTIONS.items()}
    return Config(**sections)


def from_dict(data: dict[str, dict[str, Any]], source: str = "the saved configuration") -> Config:
    """Rebuild a `Config` written by `Config.to_dict` (e.g. a checkpoint's sidecar);
    anything else in it (unknown keys, wrong types) is a UserError naming `source`."""
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
            sections[name] = cls(**values)
        except (TypeError, ValueError) as exc:
            raise UserError(f"{source}: `{name}` cannot be used ({exc}).") from None
    return Config(**sections)
