"""`phalanx.init()`: join the job this process was launched into, in the order the field
guides prescribe, so a script cannot get it wrong:

1. read the launcher's environment (torchrun / Phalanx / SLURM, or none: world size 1);
2. pick the device from LOCAL_RANK and pin it (`torch.cuda.set_device`) before anything
   is allocated on a GPU;
3. set torch threads so the ranks on one machine do not oversubscribe its cores;
4. initialise the process group (nccl on CUDA, gloo on CPU) with a timeout — at world
   size 1 too, on an in-memory store, so collectives work the same everywhere;
5. build the topology (a DeviceMesh when the strategy shards), then the strategy from it
   (`strategy`: a name and its options, decided here for the detected world, or the
   `StrategyChoice` a caller decided once, e.g. the trainer; built as it is);
6. record the run's environment (`environment.json`: strategy, ranks, versions; rank 0,
   in the run directory when there is one) for its report;
7. seed from (seed, rank); and destroy the process group at exit — after an exception
   that left the script, at once: no barrier a failed rank's peers would wait in, and a
   deadline (`FAILED_EXIT_S`) on the shutdown itself. The peers' next collective then
   fails on the lost connection (and under a launcher the agent stops them), so one
   rank's exception ends the job within seconds instead of hanging it.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from phalanx.cluster import protocol
from phalanx.cluster.env import LaunchEnv, detect_launch_env, usable_cores
from phalanx.cluster.faults import announce
from phalanx.cluster.lifecycle import die_with_agent
from phalanx.cluster.peers import gather_peers
from phalanx.cluster.protocol import record_for_agent
from phalanx.cluster.rendezvous import attempt_store
from phalanx.cluster.slurm_store import srun_store
from phalanx.cluster.startup_trace import mark
from phalanx.config.fields import tracker_list
from phalanx.errors import DistributedError, UserError
from phalanx.hang.watchdog import timeout_from_env
from phalanx.report.run_report import write_environment
from phalanx.runtime.memory_history import check_entries, plain_failure
from phalanx.runtime.memory_history import start as start_history
from phalanx.runtime.pace import Pace
from phalanx.runtime.run import Run, derive_seed
from phalanx.strategies import StrategyChoice, build, choose_for_script
from phalanx.strategies.topology import data_parallel


def _pick_device(env: LaunchEnv, backend: str) -> torch.device:
    if backend == "gloo" or not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if env.local_rank >= count:
        raise DistributedError(
            f"LOCAL_RANK {env.local_rank} has no GPU: only {count} visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
            f"Start at most {count} processes per node.", [env.rank])
    device = torch.device("cuda", env.local_rank)
    torch.cuda.set_device(device)
    return device


def _set_threads(env: LaunchEnv, threads: int | None) -> int:
    if threads is None and "OMP_NUM_THREADS" in os.environ:
        threads = int(os.environ["OMP_NUM_THREADS"])
    if threads is None:
        threads = max(1, usable_cores() // max(1, env.local_world_size))
    torch.set_num_threads(threads)
    return threads


STRAGGLER_EVERY = 5  # phalanx.init's default (the trainer's: `--straggler-every`)


def _straggler_every(given: int | None) -> int:
    if given is None:
        raw = os.environ.get(protocol.STRAGGLER_EVERY, str(STRAGGLER_EVERY))
        try:
            given = int(raw)
        except ValueError:
            raise UserError(f"{protocol.STRAGGLER_EVERY}=`{raw}` is not a whole number of "
                            f"steps; set it to N >= 0 (0: off).") from None
    if given < 0:
        raise UserError(f"straggler_every must be >= 0 (0: off), got {given}.")
    return given


def _backend(backend: str) -> str:
    backend = ("nccl" if torch.cuda.is_available() else "gloo") if backend == "auto" else backend
    if backend == "nccl" and not torch.cuda.is_available():
        raise UserError("`--backend nccl` needs CUDA GPUs and none is visible; use gloo on CPU.")
    return backend


def _debug(debug_collectives: bool) -> None:
    if debug_collectives:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()


def _pace(env: LaunchEnv, topology: Any, every: int | None) -> Pace:
    return Pace(env.world_size, env.rank, topology.device, _straggler_every(every),
                host_of=topology.peers.host if topology.peers else lambda rank: "?")


def init(seed: int = 0, *, backend: str = "auto",
         strategy: str | StrategyChoice | None = None, timeout_s: float = 600.0,
         threads: int | None = None, hang_timeout_s: float | None = None,
         hang_report_dir: str | Path | None = None, debug_collectives: bool = False,
         log_dir: str | Path | None = None, out: str | Path | None = None,
         trackers: str | Sequence[str] | None = None, memory_history: int = 0,
         straggler_every: int | None = None, **strategy_options: Any) -> Run:
    """Join the job this process was launched into (or a 1-process job) and return a `Run`.

    `strategy`: a name with its options as keywords (`strategy="ddp", bucket_cap_mb=1`;
    None: ddp for several ranks, single for one), or a `StrategyChoice` (`choose`).
    `hang_timeout_s` (or PHALANX_HANG_TIMEOUT) starts the hang watchdog (`Run.watch`).
    `debug_collectives` has torch verify every collective across ranks
    (TORCH_DISTRIBUTED_DEBUG=DETAIL) and a mismatch is raised in plain words.
    `out`: the run directory (`run.out`); under `phalanx run` its `--out` instead.
    `log_dir`: where `run.log` writes metrics.jsonl and TensorBoard's tb/ (default: `out`).
    `trackers`: experiment trackers `run.log` also writes to ("wandb", "mlflow"; default: the
    PHALANX_TRACKERS variable, which `phalanx run --tracker` sets), from rank 0.
    `memory_history`: on CUDA, record the last N allocator events; a CUDA out-of-memory then
    writes a snapshot into `out` (runtime.memory_history).
    `straggler_every`: every N optimizer steps (`run.step`) a persistently slow rank is
    named (runtime.pace; default: PHALANX_STRAGGLER_EVERY, which `phalanx run
    --straggler-every` sets, else 5; 0: off).
    """
    announce()  # PHALANX_FAULT checked (and said once per job) before anything starts
    _debug(debug_collectives)
    tracking = tracker_list(trackers if trackers is not None
                             else os.environ.get(protocol.TRACKERS))
    check_entries(memory_history)
    env = detect_launch_env()
    choice = _strategy_choice(_as_launched(strategy), env.world_size, strategy_options)
    for name, value in env.rendezvous:  # srun sets no MASTER_ADDR/PORT: derived ones
        os.environ.setdefault(name, value)

    die_with_agent()
    backend = _backend(backend)
    device = _pick_device(env, backend)
    n_threads = _set_threads(env, threads)
    created = _process_group(env, backend, timeout_s)
    mark("phalanx.init: process group made")

    topology = data_parallel(env.rank, env.local_rank, env.world_size, env.local_world_size,
                             device, backend, env.launcher,
                             layout=choice.layout if choice.spec.sharded else None,
                             peers=gather_peers(env.world_size))
    chosen = _checked(build(choice, topology), created)
    run_dir, log = _directories(out, log_dir)
    run = Run(topology=topology, strategy=chosen, seed=seed, threads=n_threads,
              log_dir=log, out=run_dir, trackers=tracking,
              memory_history=start_history(topology.device, memory_history),
              pace=_pace(env, topology, straggler_every))
    fail_fast(run)
    _note_spread(run, choice, env.local_world_size)
    _record_environment(run, run_dir or log)  # the report's: strategy, ranks, versions
    torch.manual_seed(derive_seed(seed, env.rank))

    hang = hang_timeout_s or timeout_from_env()
    if hang > 0 and not os.environ.get(protocol.WATCHED):
        run.watch(hang, hang_report_dir or os.environ.get(protocol.HANG_REPORT_DIR) or run_dir)
    return run


def _directories(out: str | Path | None, log_dir: str | Path | None
                 ) -> tuple[Path | None, Path | None]:
    """The run directory (`phalanx run`'s `--out`, else `out`; made) and where `run.log`
    writes (`log_dir`, else the run directory)."""
    found = os.environ.get(protocol.RUN_DIR) or out
    run_dir = Path(found) if found else None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir, (Path(log_dir) if log_dir is not None else run_dir)


def _record_environment(run: Run, where: Path | None) -> None:
    """Rank 0: `where/environment.json` (the run report reads it), when there is a `where`."""
    if run.is_main and where is not None:
        where.mkdir(parents=True, exist_ok=True)
        write_environment(run, None, where)


def _note_spread(run: Run, choice: StrategyChoice, local_world_size: int) -> None:
    """A sharded layout whose shard groups span machines: said once, on stderr (the
    strategy's note, not the program's output)."""
    spread = choice.layout.across_machines(local_world_size, run.topology.nodes) \
        if choice.spec.sharded else None
    if spread:
        run.print(f"phalanx: note: {spread}", file=sys.stderr)


def _process_group(env, backend: str, timeout_s: float) -> bool:
    """Make torch's default process group unless one exists; True when made here."""
    if dist.is_initialized():
        return False
    timeout = datetime.timedelta(seconds=timeout_s)
    if env.world_size == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                timeout=timeout, store=_store(env, timeout))
    return True


FAILED_EXIT_S = 5.0  # after an uncaught exception, the longest the shutdown may take


def fail_fast(run: Run) -> None:
    """Close `run` at exit — as failed when an exception left the script (no barrier),
    the exception recorded for the launcher, and the process ended `FAILED_EXIT_S` later
    whatever the shutdown waits for."""
    previous = sys.excepthook

    def hook(kind, exc, tb) -> None:
        run._failed = True
        plain = plain_failure(exc, run)
        previous(kind, exc, tb)
        _record(plain or exc)
        if plain is not None:
            print(f"phalanx: error: {plain}", file=sys.stderr, flush=True)
        _exit_within(FAILED_EXIT_S, exc)

    sys.excepthook = hook
    atexit.register(_close_at_exit, run)


def _record(exc: BaseException) -> None:
    """`record_for_agent` as from an `except` block, where torch's error handler reads the
    traceback it writes into the agent's error file (outside one: "NoneType: None") —
    `exc`'s own traceback, without this function's frame (Python 3.11+ reads it from the
    exception)."""
    frames = exc.__traceback__
    try:
        raise exc
    except BaseException:
        exc.__traceback__ = frames
        record_for_agent(exc)


def _exit_within(seconds: float, exc: BaseException | None) -> None:
    """End the process `seconds` from now unless it has ended by itself (a daemon timer:
    it runs during the atexit handlers), with the code it would have ended with: a
    UserError's (2), a SystemExit's, 130 for Ctrl-C, else 1."""
    code = getattr(exc, "exit_code", None)
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else 1
    elif isinstance(exc, KeyboardInterrupt):
        code = 130
    code = code if isinstance(code, int) else 1
    deadline = threading.Timer(seconds, os._exit, (code,))
    deadline.daemon = True
    deadline.start()


def _close_at_exit(run: Run) -> None:
    uncaught = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    failed = run._failed or uncaught is not None
    if failed and not run._failed and dist.is_initialized():  # marked by the CLI (phalanx
        _exit_within(FAILED_EXIT_S, uncaught)  # run under torchrun/srun), still to close
    run.close(failed=failed)


def _as_launched(strategy: str | StrategyChoice | None) -> str | StrategyChoice | None:
    """The script's strategy, agreed with the launcher's (`phalanx run --strategy NAME`):
    the launcher's when the script names none; one line when the two differ."""
    launched = os.environ.get(protocol.STRATEGY)
    if not launched or strategy is None:
        return launched or strategy
    named = strategy.name if isinstance(strategy, StrategyChoice) else strategy
    if named != launched:
        raise UserError(f"the script calls phalanx.init(strategy={named!r}), but it was "
                        f"launched with `phalanx run --strategy {launched}`: the job would "
                        f"train with a strategy its command line does not say. Drop one of "
                        f"them, or make both name the same strategy.")
    return strategy


def _strategy_choice(strategy: str | StrategyChoice | None, world: int,
                     options: dict[str, Any]) -> StrategyChoice:
    """The choice a caller made (for this world), or a script's name + options decided
    for `world` ranks."""
    if not isinstance(strategy, StrategyChoice):
        return choose_for_script(strategy, world, **options)
    if options:
        raise TypeError(f"phalanx.init(strategy=<{strategy.name} choice>) carries its "
                        f"options; {', '.join(sorted(options))} given besides. Decide them "
                        f"into the choice, or pass the strategy by name.")
    if strategy.world != world:
        raise ValueError(f"the strategy `{strategy.name}` was chosen for {strategy.world} "
                         f"rank(s), and this process joined a job of {world} (launcher "
                         f"variables: RANK/WORLD_SIZE, or SLURM's under srun). Choose it "
                         f"from the world this process joins (detect_launch_env).")
    return strategy


def _checked(chosen, created: bool):
    """The strategy, if it can run in this world on this device; else its UserError, the
    process group this call made destroyed first."""
    try:
        chosen.check()
    except Exception:
        if created:
            dist.destroy_process_group()
        raise
    return chosen


def _store(env, timeout: datetime.timedelta):
    """The agent's store (one key space per restart), the store a plain `srun` step meets
    on (its port found, not assumed: phalanx.cluster.slurm_store), or None: torch's env://."""
    store = attempt_store(env.world_size, timeout)
    if store is None and env.launcher == "slurm" and env.rendezvous:

        store = srun_store(env.rank, env.world_size, timeout)
    return store
