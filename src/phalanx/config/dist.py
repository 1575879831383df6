"""The `[dist]` section: processes, strategy options, machines, timeouts and checks."""

from __future__ import annotations

import re
from dataclasses import dataclass

from phalanx.config.fields import (
    MAX_PROCS,
    MAX_TIMEOUT_S,
    _at_most,
    _check_values,
    _positive,
    opt,
)
from phalanx.config.layout import SCHEDULES as PP_SCHEDULES
from phalanx.config.layout import check_request, requested
from phalanx.config.nccl import PRESET_NAMES
from phalanx.config.strategy import (
    GRAD_SYNC,
    SPECS,
    check_layout,
    default_name,
    refuse_foreign,
    spec,
)
from phalanx.errors import UserError

STRATEGIES = tuple(SPECS)
BACKENDS = ("auto", "gloo", "nccl")
NCCL_PRESETS = PRESET_NAMES
FAULT_TOLERANCE = ("none", "torchft")


@dataclass(kw_only=True)
class DistConfig:
    nproc_per_node: int | None = opt(None, "Worker processes on this machine (default: one "
                                           "per visible GPU, else one per usable CPU core).")
    strategy: str | None = opt(None, "Parallelism: " + "; ".join(
        f"{s.name}: {s.summary}" for s in SPECS.values()) + ". Default: ddp when more than "
        "one rank, else single. See docs/strategies.md.", choices=STRATEGIES)
    dp_replicate: int | None = opt(None, "Layout: replica groups (DDP's replicas, or HSDP's "
                                         "replicate dimension with --dp-shard); -1: the rest "
                                         "of the world. See docs/parallelism.md.", metavar="R")
    dp_shard: int | None = opt(None, "Layout: ranks FSDP2 shards over (inside a replica group "
                                     "with --dp-replicate: HSDP); -1: the rest of the world. "
                                     "Without --strategy it means fsdp.", metavar="S")
    tp: int | None = opt(None, "Layout: tensor-parallel ranks, which split each block's "
                               "matrices and share one batch (with FSDP2 over the rest: "
                               "fsdp); -1: the rest of the world.", metavar="T")
    pp: int | None = opt(None, "Layout: pipeline stages, the model cut by blocks into P "
                               "(with FSDP2 or --tp inside each: fsdp); the micro-batches "
                               "are --grad-accum's. See docs/parallelism.md.", metavar="P")
    pp_schedule: str = opt("1f1b", "Pipeline schedule under --pp (torch's): 1f1b (least "
                                   "activation memory) or gpipe; either needs --grad-accum "
                                   "of at least --pp.", choices=PP_SCHEDULES)
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
    fault_tolerance: str = opt("none", "What a dead rank costs. none: every rank stops and "
                                       "restarts from the last checkpoint (--max-restarts). "
                                       "torchft: each rank is a replica group; the others go "
                                       "on without it and it rejoins with a live group's "
                                       "state (pip install 'phalanx[ft]'; "
                                       "docs/fault-tolerance.md).", choices=FAULT_TOLERANCE)
    lighthouse: str | None = opt(None, "torchft: HOST:PORT (or http://HOST:PORT) of a "
                                       "lighthouse every machine reaches (default: Phalanx "
                                       "starts one on loopback).",
                                 metavar="HOST:PORT")
    min_replicas: int = opt(1, "torchft: the fewest replica groups that may take a step "
                                "(across machines, a majority avoids a split brain).")
    ft_join_timeout_s: float = opt(3.0, "torchft: how long a quorum waits for a group that "
                                        "is late or gone before it goes on without it.")
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
    straggler_every: int = opt(5, "Every N optimizer steps, compare the ranks' own time "
                                 "per step (the step minus its waits in collectives) and name "
                                 "a rank over 2× the others' median (and 5 ms over it) at 2 "
                                 "checks in a row "
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
        _positive(self, "rdzv_timeout_s", "min_replicas", "ft_join_timeout_s")
        if self.lighthouse:
            lighthouse_url(self.lighthouse)
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
        # ranks, so ddp — at 1 rank a ddp option is harmless); the name only, by the
        # registry's default rule: the strategy itself is decided by `choose`, once per
        # process (which refuses another strategy's options when layout flags chose it)
        check_request(requested(self))
        if self.strategy:
            check_layout(spec(self.strategy), requested(self))
        if self.strategy or not any(v is not None for v in requested(self).values()):
            refuse_foreign(self, self.strategy or default_name(self.nproc_per_node or 2))
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


def endpoint(text: str, flag: str = "--rdzv-endpoint") -> tuple[str, int]:
    """HOST:PORT ([v6]:PORT) → (host, port), or a UserError naming `flag`."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(f"`{flag} {text}` must be HOST:PORT with a port in 1..65535, "
                        f"e.g. `{flag} 10.0.0.1:29400`.")
    return host, int(port)


_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


def lighthouse_url(text: str) -> str:
    """`--lighthouse` HOST:PORT, [v6]:PORT or http://HOST:PORT[/] → the URL torchft
    connects to (`http://HOST:PORT`), or a UserError naming the flag."""
    rest = text[len("http://"):].rstrip("/") if text.startswith("http://") else text
    host = rest.rpartition(":")[0]
    if not _HOST.fullmatch(host):
        rest = ""  # a path, a user, another scheme: refused below
    try:
        endpoint(rest, "--lighthouse")
    except UserError:
        raise UserError(f"`--lighthouse {text}` must be HOST:PORT or http://HOST:PORT with a "
                        f"port in 1..65535, e.g. `--lighthouse 10.0.0.1:29510`.") from None
    return f"http://{rest}"
