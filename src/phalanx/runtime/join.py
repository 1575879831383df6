"""`phalanx.init()`: join the job this process was launched into, in the order the field
guides prescribe, so a script cannot get it wrong:

1. read the launcher's environment (torchrun / Phalanx / SLURM, or none: world size 1);
2. pick the device from LOCAL_RANK and pin it (`torch.cuda.set_device`) before anything
   is allocated on a GPU;
3. set torch threads so the ranks on one machine do not oversubscribe its cores;
4. initialise the process group (nccl on CUDA, gloo on CPU) with a timeout — at world
   size 1 too, on an in-memory store, so collectives work the same everywhere;
5. build the topology (a DeviceMesh when the strategy shards), then the strategy from it;
6. seed from (seed, rank); and destroy the process group at exit, also on error.
"""

from __future__ import annotations

import atexit
import datetime
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from phalanx.cluster.env import LaunchEnv, detect_launch_env, usable_cores
from phalanx.errors import DistributedError, UserError
from phalanx.cluster.rendezvous import attempt_store
from phalanx.runtime.run import Run, derive_seed
from phalanx.cluster.startup_trace import mark
from phalanx.strategies import default_name, spec, strategy_class
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


def init(seed: int = 0, *, backend: str = "auto", strategy: str | None = None,
         timeout_s: float = 600.0, threads: int | None = None,
         hang_timeout_s: float | None = None, hang_report_dir: str | Path | None = None,
         debug_collectives: bool = False, log_dir: str | Path | None = None,
         **strategy_options: Any) -> Run:
    """Join the job this process was launched into (or a 1-process job) and return a `Run`.

    `hang_timeout_s` (or PHALANX_HANG_TIMEOUT) starts the hang watchdog (`Run.watch`).
    `debug_collectives` has torch verify every collective across ranks
    (TORCH_DISTRIBUTED_DEBUG=DETAIL) and a mismatch is raised in plain words.
    `log_dir`: where `run.log` writes metrics.jsonl and TensorBoard's tb/.
    """
    if debug_collectives:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level_from_env()
    env = detect_launch_env()
    for name, value in env.rendezvous:  # srun sets no MASTER_ADDR/PORT: derived ones
        os.environ.setdefault(name, value)
    from phalanx.cluster.lifecycle import die_with_agent

    die_with_agent()
    backend = ("nccl" if torch.cuda.is_available() else "gloo") if backend == "auto" else backend
    if backend == "nccl" and not torch.cuda.is_available():
        raise UserError("`--backend nccl` needs CUDA GPUs and none is visible; use gloo on CPU.")
    device = _pick_device(env, backend)
    n_threads = _set_threads(env, threads)
    created = not dist.is_initialized()
    if created:
        timeout = datetime.timedelta(seconds=timeout_s)
        if env.world_size == 1 and "MASTER_ADDR" not in os.environ:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)
        else:
            dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                                    timeout=timeout, store=_store(env, timeout))
    found = spec(strategy or default_name(env.world_size))
    options = found.make_options(**strategy_options)
    from phalanx.cluster.peers import gather_peers
    mark("phalanx.init: process group made")

    topology = data_parallel(env.rank, env.local_rank, env.world_size, env.local_world_size,
                             device, backend, env.launcher, with_mesh=found.sharded,
                             peers=gather_peers(env.world_size))
    chosen = strategy_class(found.name)(topology, options)
    try:
        chosen.check()
    except Exception:
        if created:
            dist.destroy_process_group()
        raise
    run = Run(topology=topology, strategy=chosen, seed=seed, threads=n_threads,
              log_dir=Path(log_dir) if log_dir is not None else None)
    atexit.register(run.close)
    torch.manual_seed(derive_seed(seed, env.rank))
    from phalanx.hang.watchdog import timeout_from_env

    hang = hang_timeout_s or timeout_from_env()
    if hang > 0 and not os.environ.get("PHALANX_WATCHED"):
        run.watch(hang, hang_report_dir or os.environ.get("PHALANX_HANG_REPORT_DIR"))
    return run


def _store(env, timeout: datetime.timedelta):
    """The agent's store (one key space per restart), the store a plain `srun` step meets
    on (its port found, not assumed: phalanx.cluster.slurm_store), or None: torch's env://."""
    store = attempt_store(env.world_size, timeout)
    if store is None and env.launcher == "slurm" and env.rendezvous:
        from phalanx.cluster.slurm_store import srun_store

        store = srun_store(env.rank, env.world_size, timeout)
    return store
