"""`run_ranks`: a verb's work on the config's ranks — the checks that need the world size,
then `launch_or_work` (the elastic agent, or be the worker under torchrun/SLURM)."""

from __future__ import annotations

import sys
from pathlib import Path

from phalanx.cluster import protocol
from phalanx.config.sections import Config
from phalanx.config.strategy import StrategyChoice, choose
from phalanx.errors import UserError
from phalanx.launch.job import Job
from phalanx.launch.job import write as write_job
from phalanx.paths import RunDir


def check_world(cfg: Config, nproc: int, cuda: bool) -> StrategyChoice:
    """Checks that need the world size and device kind, done before any worker starts:
    the strategy's own (chosen as a worker chooses it, for the launch plan's world; its
    spec's checks, the same a worker runs) and the backend's. The choice is returned: a
    rank run in this process takes it as it is."""
    choice = choose(cfg.dist, nproc, cfg.train.grad_accum)
    choice.check(cuda)
    if cfg.dist.backend == "nccl" and not cuda:
        raise UserError("`--backend nccl` needs CUDA GPUs and none is visible; use gloo.")
    return choice


def run_ranks(cfg: Config, verb: str, argv: list[str], work, out: RunDir,
              env: dict[str, str] | None = None, job: Job | None = None,
              job_path: Path | None = None, memory=None) -> int:
    """`phalanx VERB ARGV` on the config's ranks (phalanx.launch.agent.launch_or_work), after
    the checks that need the world size (`check_world`); each rank's output goes to
    `out.logs` (unless `--tee-ranks`); `env`: more for the workers. `job`: the run as this
    launcher decided it, written to `OUT/job.json` once the checks pass; the workers start
    from it instead of parsing ARGV again (`phalanx.launch.job`; `job_path`: written there
    instead, e.g. one machine's launcher of several). `work(threads, choice)`:
    one rank; `choice` is the strategy this process decided for the launch (a rank run in
    this process, or None: the worker decides it for the world it joins). `memory(world)`:
    said beside a rank the kernel killed (phalanx.plan.oom, handed down by the CLI)."""
    from phalanx.launch.agent import launch_or_work  # lazy: `phalanx --help` loads every verb

    decided: list[StrategyChoice] = []

    def check(plan) -> None:
        import torch

        from phalanx.train.cpu_estimate import cpu_warning

        decided.append(check_world(cfg, plan.world, torch.cuda.is_available()))
        if job is not None:  # after the checks: a refused start writes nothing
            write_job(job, job_path)
        slow = None if torch.cuda.is_available() else cpu_warning(cfg, plan.threads)
        if slow:  # up front, before minutes pass in silence
            print(f"phalanx: {slow}", file=sys.stderr, flush=True)

    logs = {} if cfg.dist.tee_ranks else {  # OUT resolved, never a link at OUT/logs
        protocol.RANK_LOGS: str(out.root.resolve() / out.logs.name)}
    handed = {} if job is None else {protocol.JOB: str((job_path or out.job).absolute())}
    return launch_or_work(cfg.dist, ["-m", "phalanx", verb, *argv],
                          lambda threads: work(threads, decided[-1] if decided else None),
                          env={**logs, **handed, **(env or {})}, check=check, memory=memory)
