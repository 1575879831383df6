"""The store a job step's tasks meet on under plain `srun` (no torchrun, no MASTER_PORT).

Rank 0 serves it on the first free port of `slurm_env.candidate_ports` and writes the
step's id (`JOB.STEP`) in it; every other task tries the candidates in the same order
and takes the store that holds its own step's id — so a port another job on the node
derived as well (or any other program holds) is skipped instead of joining the wrong
job or failing. MASTER_PORT is then set to the port in use, for what reads it later
(the hang watchdog's store client).
"""

from __future__ import annotations

import datetime
import os
import threading
import time

from phalanx.errors import DistributedError
from phalanx.slurm_env import candidate_ports, step_id

OWNER = "phalanx/slurm-step"
PROBE_S = 2.0  # how long a task waits on one candidate before it tries the next


def srun_store(rank: int, world_size: int, timeout: datetime.timedelta):
    import torch.distributed as dist

    environ = dict(os.environ)
    host, ports, me = environ["MASTER_ADDR"], candidate_ports(environ), step_id(environ)
    if rank == 0:
        store, port = _serve(dist, ports, world_size, timeout, me)
    else:
        store, port = _find(dist, host, ports, world_size, timeout, me, rank)
    os.environ["MASTER_PORT"] = str(port)
    return store


def _serve(dist, ports: list[int], world_size: int, timeout, me: str):
    busy = []
    for port in ports:
        try:
            store = dist.TCPStore("0.0.0.0", port, world_size, is_master=True, timeout=timeout,
                                  wait_for_workers=False)
        except (RuntimeError, OSError) as exc:  # torch's DistNetworkError is a RuntimeError
            if "in use" not in str(exc).lower():
                raise
            busy.append(port)
            continue
        store.set(OWNER, me)
        return store, port
    raise DistributedError(f"rank 0 found every port it may use for step {me} in use on "
                           f"this node ({', '.join(map(str, busy))}): set MASTER_PORT to a "
                           f"free port in the job script, or ask SLURM for reserved ones "
                           f"(`srun --resv-ports`).", [0])


def _find(dist, host: str, ports: list[int], world_size: int, timeout, me: str, rank: int):
    deadline = time.monotonic() + timeout.total_seconds()
    silent: set[int] = set()  # held by a program that is not a store: not asked again
    while time.monotonic() < deadline:
        for port in (p for p in ports if p not in silent):
            client = _client(dist, host, port, world_size)
            if client is _SILENT:
                silent.add(port)
                continue
            try:
                if client is not None and client.check([OWNER]) and \
                        client.get(OWNER).decode() == me:
                    client.set_timeout(timeout)
                    return client, port
            except (RuntimeError, OSError):  # it went away
                continue
        time.sleep(0.1)
    raise DistributedError(f"rank {rank} found no store of step {me} on {host} at ports "
                           f"{', '.join(map(str, ports))} within {timeout.total_seconds():g} "
                           f"s: rank 0 did not start, or {host} is not reachable from here.",
                           [rank])


_SILENT = object()


def _client(dist, host: str, port: int, world_size: int):
    """A store client on host:port; None when nobody is there (yet); _SILENT when a
    program that is not a store holds the port. torch's client waits for a store's reply
    without a time limit, so it is made on a daemon thread, left behind (blocked on that
    socket) in the last case — once per port, as such a port is not asked again."""
    box: list = []

    def connect() -> None:
        try:
            box.append(dist.TCPStore(host, port, world_size, is_master=False,
                                     timeout=datetime.timedelta(seconds=PROBE_S),
                                     wait_for_workers=False))
        except (RuntimeError, OSError):  # nobody there (yet)
            pass

    thread = threading.Thread(target=connect, name=f"phalanx-store-probe-{port}", daemon=True)
    thread.start()
    thread.join(PROBE_S + 1.0)
    if thread.is_alive():
        return _SILENT
    return box[0] if box else None
