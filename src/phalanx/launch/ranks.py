"""`run_ranks`: a verb's work on the config's ranks — the checks that need the world size,
then `launch_or_work` (the elastic agent, or be the worker under torchrun/SLURM)."""

from __future__ import annotations

import sys

from phalanx.cluster import protocol
from phalanx.config.sections import Config
from phalanx.config.strategy import choose
from phalanx.errors import UserError
from phalanx.paths import RunDir


def check_world(cfg: Config, nproc: int, cuda: bool) -> None:
    """Checks that need the world size and device kind, done before any worker starts:
    the strategy's own (chosen as a worker chooses it, for the launch plan's world; its
    spec's checks, the same a worker runs) and the backend's."""
    choose(cfg.dist, nproc, cfg.train.grad_accum).check(cuda)
    if cfg.dist.backend == "nccl" and not cuda:
        raise UserError("`--backend nccl` needs CUDA GPUs and none is visible; use gloo.")


def run_ranks(cfg: Config, verb: str, argv: list[str], work, out: RunDir,
              env: dict[str, str] | None = None) -> int:
    """`phalanx VERB ARGV` on the config's ranks (phalanx.launch.agent.launch_or_work), after
    the checks that need the world size (`check_world`); each rank's output goes to
    `out.logs` (unless `--tee-ranks`); `env`: more for the workers."""
    from phalanx.launch.agent import launch_or_work  # lazy: `phalanx --help` loads every verb

    def check(plan) -> None:
        import torch

        from phalanx.train.cpu_estimate import cpu_warning

        check_world(cfg, plan.world, torch.cuda.is_available())
        slow = None if torch.cuda.is_available() else cpu_warning(cfg, plan.threads)
        if slow:  # up front, before minutes pass in silence
            print(f"phalanx: {slow}", file=sys.stderr, flush=True)

    logs = {} if cfg.dist.tee_ranks else {  # OUT resolved, never a link at OUT/logs
        protocol.RANK_LOGS: str(out.root.resolve() / out.logs.name)}
    return launch_or_work(cfg.dist, ["-m", "phalanx", verb, *argv], work,
                          env={**logs, **(env or {})}, check=check)
