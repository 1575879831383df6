"""Start local workers through torch's own elastic agent (what torchrun runs).

Phalanx does not spawn processes or run a rendezvous itself: it fills in a
`LaunchConfig` — torch's c10d rendezvous on 127.0.0.1 (its stores bound to loopback
only, see phalanx.rendezvous), `max_restarts` — and hands
the worker command line to `elastic_launch`. Each worker re-enters the same CLI verb,
finds the launcher's environment (RANK, LOCAL_RANK, WORLD_SIZE, ...) and becomes a rank.
"""

from __future__ import annotations

import contextlib
import logging
import re
import os
import signal
import socket
import sys
import uuid

from phalanx.envinfo import usable_cores
from phalanx.errors import DistributedError, Interrupted, UserError
from phalanx.hang.mismatch import PEER_LOST
from phalanx.hang.watchdog import HANG_EXIT_CODE
from phalanx.rendezvous import ROUND


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


def launch_config(nproc: int, max_restarts: int, nodes=None):
    """torch's LaunchConfig: one node on loopback, or several meeting at `nodes.endpoint`
    (this node's stores bound to its address towards the endpoint)."""
    from torch.distributed.launcher.api import LaunchConfig

    from phalanx.rendezvous import register

    common = dict(nproc_per_node=nproc, rdzv_backend=register(), max_restarts=max_restarts,
                  monitor_interval=0.1)
    if nodes is None:  # every store and gloo listen on loopback only
        return LaunchConfig(min_nodes=1, max_nodes=1, run_id=f"phalanx-{uuid.uuid4().hex[:8]}",
                            local_addr="127.0.0.1", rdzv_endpoint="127.0.0.1:0", **common)
    return LaunchConfig(min_nodes=nodes.min_nodes, max_nodes=nodes.max_nodes,
                        run_id=nodes.run_id, local_addr=nodes.local_addr,
                        rdzv_endpoint=nodes.endpoint, rdzv_timeout=int(nodes.timeout_s),
                        rdzv_configs={"is_host": nodes.is_host,
                                      "join_timeout": int(nodes.timeout_s)}, **common)


def launch_workers(python_args: list[str], nproc: int, *, threads: int,
                   max_restarts: int = 0, nodes=None) -> None:
    """Run `python <python_args>` as `nproc` ranks under the elastic agent
    (e.g. `["-m", "phalanx", "train", ...]` or `["script.py", ...]`).

    Raises `UserError` with the first rank's message when every failed rank exited with
    code 2 (a user error), `DistributedError` naming the failed ranks otherwise.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    for name in ["torch.distributed.elastic", *logging.root.manager.loggerDict]:
        if name.startswith("torch.distributed.elastic"):  # each sets its own level
            logging.getLogger(name).setLevel(logging.CRITICAL)
    config = launch_config(nproc, max_restarts, nodes)
    env = {"PHALANX_LAUNCHED": "1", "OMP_NUM_THREADS": str(threads), ROUND: "0"}
    ifname = loopback_interface() if nodes is None else nodes.ifname
    if "GLOO_SOCKET_IFNAME" not in os.environ and ifname:
        env["GLOO_SOCKET_IFNAME"] = ifname
    if nodes is not None:  # the run directory's writer is global rank 0, not a launcher
        env["PHALANX_MULTINODE"] = "1"
        if os.environ.get("PHALANX_QUIET_CPP"):  # set for the launcher only
            env["TORCH_CPP_LOG_LEVEL"] = "WARNING"
    try:
        with _worker_env(env):  # the workers' environment, not this process's afterwards
            elastic_launch(config, sys.executable)(*python_args)
    except SignalException as exc:  # the agent forwarded it and waited for the workers
        raise Interrupted(exc.sigval) from None
    except ChildFailedError as exc:
        failures = exc.failures
        culprits, victims, stopped = _blame(failures)
        user = [r for r in culprits if failures[r].exitcode == 2]
        if user and all(r in user or failures[r].exitcode == -signal.SIGTERM for r in culprits):
            first = min(culprits)  # a user error (a rank stopped while exiting with it too)
            message = _message(failures[first]).split(": ", 1)[-1]
            raise UserError(f"[rank {first}] {message}" if message else
                            f"ranks {culprits} stopped with a usage error.") from None
        detail = _describe_all(culprits, failures)
        if victims:
            detail += (f"; then rank(s) {', '.join(map(str, victims))} lost the connection "
                       f"to it{_victims_at(victims, failures)}")
        if stopped:
            detail += f"; then rank(s) {', '.join(map(str, stopped))} were stopped"
        restarts = f" after {max_restarts} restart(s)" if max_restarts else ""
        raise DistributedError(f"the job failed{restarts}: {detail}.", culprits) from None




_SIGNALLED = re.compile(r"Signal \d+ \(\w+\) received by PID")


def _blame(failures: dict) -> tuple[list[int], list[int], list[int]]:
    """(culprits, victims, stopped) among the failed ranks.

    A culprit recorded an error of its own (even if the agent then stopped it), or, when
    none did, exited by itself; a victim's error says it lost a peer; the rest were
    stopped by the agent (SIGTERM) without an error of their own.
    """
    ranks = sorted(failures)
    messages = {r: _message(failures[r]) for r in ranks}
    victims = [r for r in ranks if any(m in messages[r] for m in PEER_LOST)]
    culprits = [r for r in ranks if messages[r] and r not in victims]
    if not culprits:
        culprits = [r for r in ranks if failures[r].exitcode != -signal.SIGTERM
                    and r not in victims] or victims or ranks
        victims = [r for r in victims if r not in culprits]
    stopped = [r for r in ranks if r not in culprits and r not in victims]
    return culprits, victims, stopped


def _describe_all(culprits: list[int], failures: dict) -> str:
    """Each culprit's account; ranks that failed with the same error are named together."""
    same = {_message(failures[r]).split("] ", 1)[-1] for r in culprits}
    if len(culprits) > 1 and len(same) == 1 and "" not in same:
        return f"ranks {', '.join(map(str, culprits))} failed with: {same.pop()}"
    return "; ".join(_describe(r, failures[r]) for r in culprits)


def _victims_at(victims: list[int], failures: dict) -> str:
    """` (rank 1 in backward at train.py:143 in main())`, from their recorded tracebacks."""
    from phalanx.hang.crash import failed_at

    where = []
    for r in victims:
        raw = failures[r].message
        info = raw.get("extraInfo", {}) if isinstance(raw, dict) else {}
        act = failed_at(str(info.get("py_callstack", "")))
        if act is not None and act.site is not None:
            what = f"in {act.collective} " if act.collective else ""
            where.append(f"rank {r} {what}at {act.where()}")
    return f" ({'; '.join(where)})" if where else ""


def _crashed_in(rank: int, code: int) -> str:
    """` in all_reduce at train.py:133 in run_val() (...), under ...` for a rank that
    died of a signal and left a crash record (see phalanx.hang.crash)."""
    from phalanx.hang.crash import crashed_at

    act = crashed_at(os.environ.get("PHALANX_HANG_REPORT_DIR"), rank)
    if act is None or act.site is None:
        return ""
    what = f" in {act.collective}" if act.collective else ""
    gloo = (" — gloo aborts when a peer's message does not fit the collective: the ranks "
            "ran different collectives") if act.collective and code == -signal.SIGABRT else ""
    return f"{what} at {act.where()}{act.context()}{gloo}"


def _describe(rank: int, failure) -> str:
    """`rank 1 exited with code 1: InjectedFault: ...` from the agent's failure record."""
    code, message = failure.exitcode, _message(failure)
    if code == HANG_EXIT_CODE and message:
        return f"the hang watchdog on rank {rank} stopped it: {message.split('] ', 1)[-1]}"
    if message and code == -signal.SIGTERM:
        text = f"rank {rank} failed (then the agent stopped it)"
    else:
        text = f"rank {rank} exited with code {code}"
        if code is not None and code < 0:
            text += f" (killed by signal {-code}){_crashed_in(rank, code)}"
    return f"{text}: {message[:300]}" if message else text


def _message(failure) -> str:
    """The first line of the error a worker recorded for the agent ('' if none)."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    if isinstance(message, str) and message and not message.startswith("To enable traceback") \
            and not _SIGNALLED.match(message):  # a signal says it was stopped, not why
        return message.strip().splitlines()[0]
    return ""
