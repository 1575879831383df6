"""The launcher↔worker protocol: every `PHALANX_*` environment variable — who sets it,
who reads it — and this process's role. No other module spells these names.

A Phalanx verb either launches ranks (torch's elastic agent, `phalanx.launch`) or is one
(under that agent, torchrun, `srun` or a Kubeflow pod). What the launcher tells its
workers, and what a worker leaves for its launcher, crosses in the environment (the agent
copies the launcher's environment into each worker) and in torch's error file.
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Mapping

from phalanx.config.operator import operator_pod

# launcher → workers
LAUNCHED = "PHALANX_LAUNCHED"  # "1": Phalanx's own launcher started this rank
LAUNCHER_PID = "PHALANX_LAUNCHER_PID"  # the pid of the Phalanx process that started this one
MULTINODE = "PHALANX_MULTINODE"  # "1": the job spans several machines (rank 0 checks the run)
ROUND = "PHALANX_RDZV_ROUND"  # the rendezvous round the workers were started in
FT_SAMPLES = "PHALANX_FT_SAMPLES"  # "1": torchft groups record each step attempt's samples
LAST_FAILURE = "PHALANX_LAST_FAILURE"  # the agent's last worker failure, for the next attempt
RANK_LOGS = "PHALANX_RANK_LOGS"  # DIR: each worker's output goes to DIR/rank-N.log
TRACKERS = "PHALANX_TRACKERS"  # NAMES: the experiment trackers `run.log` writes to
HANG_TIMEOUT = "PHALANX_HANG_TIMEOUT"  # seconds: start the hang watchdog (`phalanx watch`)
HANG_REPORT_DIR = "PHALANX_HANG_REPORT_DIR"  # where hang reports and stacks are written
DOCTOR_RESULT = "PHALANX_DOCTOR_RESULT"  # FILE: `phalanx doctor`'s workers write findings here
BENCH_PHASE = "PHALANX_BENCH_PHASE"  # JSON: which `phalanx bench` phase a worker runs
JOB = "PHALANX_JOB"  # FILE: the job the launcher decided; its workers start from it
RUN_DIR = "PHALANX_RUN_DIR"  # `phalanx run --out`: the script's run.out (phalanx.init)
STRAGGLER_EVERY = "PHALANX_STRAGGLER_EVERY"  # `phalanx run --straggler-every`: phalanx.init's
STRATEGY = "PHALANX_STRATEGY"  # `phalanx run --strategy`: what phalanx.init must build
FT_GROUP = "PHALANX_FT_GROUP"  # torchft: this process tree is replica group N (phalanx.ft)
FT_LIGHTHOUSE = "PHALANX_FT_LIGHTHOUSE"  # torchft: the lighthouse's address for the group
FT_START = "PHALANX_FT_START"  # torchft: HOST:PORT:GROUPS of the store the groups meet at first
# set by the launcher for itself (and inherited)
QUIET_CPP = "PHALANX_QUIET_CPP"  # "1": torch's C++ store retries silenced (several machines)
# set inside a worker for itself
RANK_LOG_FILE = "PHALANX_RANK_LOG_FILE"  # this worker's output already goes to its log
WATCHED = "PHALANX_WATCHED"  # `python -m phalanx.hang` runs a watchdog: no second one
# set by the user or the test suite
STARTUP_TRACE = "PHALANX_STARTUP_TRACE"  # FILE: each process appends its start-up marks
FAULT = "PHALANX_FAULT"  # injected faults (`phalanx.cluster.faults`)
FAULT_RELEASE = "PHALANX_FAULT_RELEASE"  # the file that ends an action=hold (faults)
FAULT_ANNOUNCED = "PHALANX_FAULT_ANNOUNCED"  # the PHALANX_FAULT value already said (faults)


class Role(enum.Enum):
    """What this process is in a job."""

    PHALANX_WORKER = "phalanx worker"  # a rank Phalanx's own launcher started
    LAUNCHED = "launched"  # a rank another launcher started: torchrun, srun, the agent
    PLAIN = "plain"  # no launcher: a verb launches ranks from here, or one process runs


def role(environ: Mapping[str, str] | None = None) -> Role:
    e = os.environ if environ is None else environ
    if e.get(LAUNCHED):
        return Role.PHALANX_WORKER
    return Role.LAUNCHED if under_launcher(e) else Role.PLAIN


def phalanx_worker(environ: Mapping[str, str] | None = None) -> bool:
    """A rank of Phalanx's own launcher (which reports a worker's error once, itself)."""
    return role(environ) is Role.PHALANX_WORKER


def one_machine_worker() -> bool:
    """A worker of Phalanx's one-machine launcher, which checked the run (its
    checkpoints, the data) before starting it: nothing to check again."""
    return phalanx_worker() and not os.environ.get(MULTINODE)


def under_launcher(environ: Mapping[str, str] | None = None) -> bool:
    """True when a launcher (torchrun, Phalanx's elastic agent, SLURM) started us."""
    e = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in e:
        return True
    if operator_pod(dict(e)):  # RANK/WORLD_SIZE there count pods: a node's launcher
        return False
    return ("RANK" in e and "WORLD_SIZE" in e) or srun_task(e)


def srun_task(environ: Mapping[str, str]) -> bool:
    """A task of an `srun` job step (not the batch script, which has no step id)."""
    return "SLURM_PROCID" in environ and "SLURM_STEP_ID" in environ and (
        "SLURM_STEP_NUM_TASKS" in environ or "SLURM_NTASKS" in environ)


def record_for_agent(exc: BaseException) -> bool:
    """Under torch's elastic agent, leave the error where the agent reports it from.
    True when Phalanx's own launcher will print it (so the worker need not)."""
    real = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not real or not isinstance(exc, Exception):
        return False
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    handler = get_error_handler()
    handler.initialize()
    # torch writes the file in place (open "w", then json.dump): a signal in between (the
    # agent stopping the ranks after a peer died) left an empty file, and the agent, parsing
    # it, crashed the launcher with a JSONDecodeError traceback. Written beside it, renamed
    # over it once whole: the agent finds the whole record or none.
    tmp = f"{real}.partial"
    os.environ["TORCHELASTIC_ERROR_FILE"] = tmp
    try:
        handler.record_exception(exc)
        os.replace(tmp, real)
    finally:
        os.environ["TORCHELASTIC_ERROR_FILE"] = real
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return phalanx_worker()


def replica_group(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(this replica group's name, the lighthouse's address) when this `phalanx train` is
    one replica group of a torchft job (started by `phalanx.ft.groups`), else None."""
    e = os.environ if environ is None else environ
    group, lighthouse = e.get(FT_GROUP), e.get(FT_LIGHTHOUSE)
    return None if group is None or lighthouse is None else (group, lighthouse)


def speaks_for_the_job() -> bool:
    """Whether this process's rank 0 says the job's notes and results on the console:
    always, but of torchft's replica groups (which share one console, prefixed `gG|`) only
    the launch's first, `0` or `HOST-0` (phalanx.ft.groups.group_name): the others would
    repeat it."""
    found = replica_group()
    return found is None or found[0].rsplit("-", 1)[-1] == "0"


def in_replica_group() -> bool:
    """This `phalanx train` is one replica group of a torchft job (`phalanx.ft.groups`)."""
    return replica_group() is not None
