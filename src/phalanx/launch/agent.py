"""One launch path for every verb: launch the ranks through torch's own elastic agent
(what torchrun runs), or, already under a launcher, be one of them.

Phalanx does not spawn processes or run a rendezvous itself. A `LaunchPlan` — processes
per node, the nodes and where they meet, threads per rank, restarts, and the variables
the workers get — is made once from the `[dist]` config; `launch_workers` fills in torch's
`LaunchConfig` (c10d rendezvous: on 127.0.0.1 for one node, its stores bound to loopback
only, see phalanx.cluster.rendezvous) and hands the worker command line to `elastic_launch`.
Each worker re-enters the same CLI verb, finds the agent's environment (RANK,
LOCAL_RANK, WORLD_SIZE, ...) and becomes a rank. What a failed job reports is built in
phalanx.launch.failures.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from phalanx.cluster import protocol
from phalanx.cluster.env import global_rank, usable_cores
from phalanx.cluster.lifecycle import ends_descendants, sigint_held_for_workers
from phalanx.cluster.nodes import node_plan
from phalanx.cluster.protocol import under_launcher
from phalanx.cluster.rendezvous import register
from phalanx.cluster.startup_trace import mark
from phalanx.config import nccl
from phalanx.errors import Interrupted
from phalanx.launch.failures import RestartNotes, job_failed, unexplained_traceback
from phalanx.launch.stops import TORCH_HANDLES, ForwardedStops

if TYPE_CHECKING:
    from phalanx.cluster.nodes import NodePlan


@dataclass(frozen=True)
class LaunchPlan:
    nproc: int  # ranks on this node
    threads: int  # torch threads per rank
    max_restarts: int = 0
    nodes: NodePlan | None = None  # None: this machine only
    env: dict[str, str] = field(default_factory=dict)  # for the workers only
    notes: tuple[str, ...] = ()  # what the launcher says before it starts them
    on_failure: Callable[[str], None] | None = None  # told each worker failure (RestartNotes)
    via_agent: bool = False  # always under the agent (a torchft group: restarted by it)
    memory: Callable[[int], str] | None = None  # world → said beside a rank killed by SIGKILL

    @property
    def world(self) -> int:
        """The most ranks the job can have."""
        return self.nproc * (self.nodes.max_nodes if self.nodes is not None else 1)

    @property
    def one_process(self) -> bool:
        return self.nproc == 1 and self.nodes is None and not self.via_agent


def plan_launch(dist, env: dict[str, str] | None = None) -> LaunchPlan:
    """The launch of a `DistConfig`: `--nproc-per-node` (default: one per GPU, else per
    usable core), the nodes (`--nnodes`, `--rdzv-endpoint`, …), `--threads-per-rank`,
    `--max-restarts`, `--debug-collectives`."""

    nproc = dist.nproc_per_node or default_nproc()
    nodes = node_plan(dist)
    env = dict(env or {})
    if dist.debug_collectives:  # read when workers import torch.distributed
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    notes = nccl_preset(dist, nodes.ifname if nodes is not None else None, env)
    return LaunchPlan(nproc, threads_per_rank(nproc, dist.threads_per_rank),
                      dist.max_restarts, nodes, env, tuple(notes),
                      via_agent=dist.fault_tolerance != "none")


def _preset_here(dist) -> None:
    """`--nccl-preset` in this worker's own environment (its launcher is not Phalanx);
    rank 0 says what it set."""
    preset: dict[str, str] = {}
    notes = nccl_preset(dist, os.environ.get("NCCL_SOCKET_IFNAME"), preset)
    os.environ.update(preset)
    if global_rank() == 0:
        for line in notes:
            print(f"phalanx: {line}", file=sys.stderr, flush=True)


def nccl_preset(dist, ifname: str | None, env: dict[str, str]) -> list[str]:
    """`--nccl-preset`'s variables into `env`; the lines that say what each does."""
    import torch


    uses_nccl = dist.backend == "nccl" or (dist.backend == "auto" and
                                           torch.cuda.is_available())
    return nccl.apply(dist.nccl_preset, ifname, env, uses_nccl)


def launch_or_work(dist, python_args: list[str], work: Callable[[int | None], int] | None,
                   *, env: dict[str, str] | None = None,
                   check: Callable[[LaunchPlan], None] | None = None,
                   on_failure: Callable[[str], None] | None = None,
                   memory: Callable[[int], str] | None = None) -> int:
    """Under a launcher: be the worker (`work(None)`). Otherwise plan the launch from
    `dist`, `check(plan)`, and run one process in-process (`work(threads)`) or start the
    ranks, each running `python PYTHON_ARGS` (e.g. `-m phalanx train ...`). `work=None`:
    always start them (the worker is another entry point). `on_failure`: told each worker
    failure the agent sees, in one line ("rank 1 was killed by SIGKILL"). `memory(world)`:
    what to say of memory when a rank was killed by SIGKILL (LaunchPlan.memory)."""
    if under_launcher() and work is not None:
        if not protocol.phalanx_worker():  # srun/torchrun: set it before NCCL starts
            _preset_here(dist)
        return work(None)
    plan = dataclasses.replace(plan_launch(dist, env), on_failure=on_failure, memory=memory)
    if check is not None:
        check(plan)
    for line in plan.notes:
        print(f"phalanx: {line}", file=sys.stderr, flush=True)
    if work is not None and plan.one_process:
        with _worker_env(plan.env):
            return work(plan.threads)
    if plan.nodes is not None:  # on stderr: `--json` output stays JSON
        print(f"phalanx: {plan.nodes.label}; waiting up to {plan.nodes.timeout_s:g} s for "
              f"{plan.nodes.min_nodes} node(s) to join", file=sys.stderr, flush=True)
    mark("starting the ranks (torch's elastic agent)")
    start_workers(python_args, plan)
    return 0


@contextlib.contextmanager
def _worker_env(values: dict[str, str]):
    """Set `values` in os.environ (the agent copies it into every worker) and put the
    previous values back afterwards, so an in-process caller is not left 'launched'."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def loopback_interface() -> str | None:
    """The name of the loopback interface (`lo` on Linux), if the machine has one."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


def default_nproc() -> int:
    """One process per visible GPU; without GPUs, one per usable CPU core."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return usable_cores()


def threads_per_rank(nproc: int, requested: int | None) -> int:
    """torch threads per rank so that nproc ranks share the cores without oversubscribing."""
    return requested or max(1, usable_cores() // nproc)


def launch_config(nproc: int, max_restarts: int, nodes: NodePlan | None = None,
                  log_dir: str | None = None):
    """torch's LaunchConfig: one node on loopback, or several meeting at `nodes.endpoint`
    (this node's stores bound to its address towards the endpoint). The agent's files
    (workers' error records) go to `log_dir` (default: a torchelastic_* temp dir that
    torch leaves behind)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig


    common: dict[str, Any] = dict(
        nproc_per_node=nproc, rdzv_backend=register(), max_restarts=max_restarts,
        monitor_interval=0.1, logs_specs=DefaultLogsSpecs(log_dir=log_dir))
    if "signals_to_handle" in LaunchConfig.__dataclass_fields__:  # SIGINT and SIGTERM are
        common["signals_to_handle"] = TORCH_HANDLES  # ForwardedStops' (launch.stops)
    if nodes is None:  # every store and gloo listen on loopback only
        return LaunchConfig(min_nodes=1, max_nodes=1, run_id=f"phalanx-{uuid.uuid4().hex[:8]}",
                            local_addr="127.0.0.1", rdzv_endpoint="127.0.0.1:0", **common)
    configs: dict[str, Any] = {"is_host": nodes.is_host, "join_timeout": int(nodes.timeout_s)}
    if nodes.node_rank is not None:  # named when two launchers claim node rank 0
        configs["node_rank"] = nodes.node_rank
    return LaunchConfig(min_nodes=nodes.min_nodes, max_nodes=nodes.max_nodes,
                        run_id=nodes.run_id, local_addr=nodes.local_addr,
                        rdzv_endpoint=nodes.endpoint, rdzv_timeout=int(nodes.timeout_s),
                        rdzv_configs=configs, **common)


def workers_env(plan: LaunchPlan) -> dict[str, str]:
    """What every worker of `plan` finds in its environment besides the agent's own."""
    env = {protocol.LAUNCHED: "1", "OMP_NUM_THREADS": str(plan.threads), protocol.ROUND: "0",
           protocol.LAUNCHER_PID: str(os.getpid()), **plan.env}
    nodes = plan.nodes
    ifname = loopback_interface() if nodes is None else nodes.ifname
    if "GLOO_SOCKET_IFNAME" not in os.environ and ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
    if nodes is not None:  # the run directory's writer is global rank 0, not a launcher
        env[protocol.MULTINODE] = "1"
        if os.environ.get(protocol.QUIET_CPP):  # set for the launcher only
            env["TORCH_CPP_LOG_LEVEL"] = "WARNING"
    return env


def launch_workers(python_args: list[str], nproc: int, *, threads: int,
                   max_restarts: int = 0) -> None:
    """Run `python <python_args>` as `nproc` local ranks under the elastic agent (the
    tests' and benchmarks' way in; the verbs go through `launch_or_work`)."""
    start_workers(python_args, LaunchPlan(nproc, threads, max_restarts))


def start_workers(python_args: list[str], plan: LaunchPlan) -> None:
    """Run `python <python_args>` as `plan.nproc` ranks under the elastic agent
    (e.g. `["-m", "phalanx", "train", ...]` or `["script.py", ...]`).

    Raises `UserError` with the first rank's message when every failed rank exited with
    code 2 (a user error), `DistributedError` naming the failed ranks (and, across
    machines, this one) otherwise.
    """
    import torch.distributed.elastic.agent.server.local_elastic_agent  # noqa: F401 - their
    import torch.distributed.launcher.api  # noqa: F401 - loggers exist (each sets a level)

    for name in ["torch.distributed.elastic", *logging.root.manager.loggerDict]:
        if name.startswith("torch.distributed.elastic"):  # each sets its own level
            logging.getLogger(name).setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="phalanx-agent-") as logs:  # removed after
        config = launch_config(plan.nproc, plan.max_restarts, plan.nodes, logs)
        _launch(config, python_args, plan)


def _launch(config, python_args: list[str], plan: LaunchPlan) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch


    host = socket.gethostname() if plan.nodes is not None else None
    try:  # the workers' environment, not this process's afterwards
        with _worker_env(workers_env(plan)), ForwardedStops() as stops, \
                RestartNotes(host, plan.on_failure, stops), \
                sigint_held_for_workers(python_args[:2] == ["-m", "phalanx"]), \
                ends_descendants():
            elastic_launch(config, sys.executable)(*python_args)
    except SignalException as exc:  # the agent forwarded it and waited for the workers
        raise Interrupted(exc.sigval) from None
    except ChildFailedError as exc:
        reports = plan.env.get(protocol.HANG_REPORT_DIR) or os.environ.get(
            protocol.HANG_REPORT_DIR)  # where ranks killed by a signal left their stacks
        logs = plan.env.get(protocol.RANK_LOGS)
        stack = unexplained_traceback(exc.failures) if logs else None
        if stack:  # not an error Phalanx explains: its traceback once (each rank's: its log)
            print(stack, file=sys.stderr, flush=True)
        said = plan.memory
        memory = None if said is None else (lambda: said(plan.world))
        raise job_failed(exc.failures, plan.max_restarts, host, reports, logs,
                         memory) from None
