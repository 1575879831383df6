"""The store a job step's tasks meet on under plain `srun` (no torchrun, no MASTER_PORT).

Rank 0 serves it on the first free port of `slurm_env.candidate_ports` and writes the
step's id (`JOB.STEP`) in it; every other task tries the candidates in the same order
and takes the store that holds its own step's id — so a port another job on the node
derived as well (or any other program holds) is skipped instead of joining the wrong
job or failing. MASTER_PORT is then set to the port in use, for what reads it later
(the hang watchdog's store client).

The store listens on one address, the one the other tasks connect to (MASTER_ADDR as
rank 0's host resolves it; `listen_address`), through the socket Phalanx binds itself
(`rendezvous.bound_store`) — not on every interface, as `TCPStore("0.0.0.0", …)` would.
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import socket
import threading
import time

from phalanx.cluster.rendezvous import bound_store
from phalanx.cluster.slurm_env import candidate_ports, expand_nodelist, step_id
from phalanx.errors import DistributedError

OWNER = "phalanx/slurm-step"
PROBE_S = 2.0  # how long a task waits on one candidate before it tries the next
STRIKES = 3  # silent probes (each waiting longer) before a port is not asked again


def srun_store(rank: int, world_size: int, timeout: datetime.timedelta):
    import torch.distributed as dist

    environ = dict(os.environ)
    host, ports, me = environ["MASTER_ADDR"], candidate_ports(environ), step_id(environ)
    if rank == 0:
        store, port = _serve(host, listen_address(environ, ports[0]), ports, timeout, me)
    else:
        store, port = _find(dist, host, ports, world_size, timeout, me, rank)
    os.environ["MASTER_PORT"] = str(port)
    return store


def listen_address(environ: dict, port: int) -> str:
    """The address rank 0's store listens on: MASTER_ADDR as this host resolves it, which
    is where the other tasks connect. A name that resolves to loopback here (a
    `127.0.1.1 host` line in /etc/hosts) while the step spans other hosts, which resolve
    it to this host's network address: the address this host uses towards them."""
    host = environ["MASTER_ADDR"]
    address = _resolve(host)
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
    others = expand_nodelist(nodelist)[1:] if nodelist else []  # rank 0 is on the first
    if not ipaddress.ip_address(address).is_loopback or not others:
        return address
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((_resolve(others[0]), port))  # no packet is sent
            return s.getsockname()[0]
    except OSError as exc:
        raise DistributedError(f"MASTER_ADDR `{host}` resolves to {address} (loopback) on "
                               f"{socket.gethostname()} and there is no route to the step's "
                               f"host {others[0]} ({exc.strerror or exc}): set MASTER_ADDR "
                               f"to an address of this host the others reach.", [0]) from None


def _resolve(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise DistributedError(f"cannot resolve MASTER_ADDR `{host}` on "
                               f"{socket.gethostname()}: set MASTER_ADDR to an address or a "
                               f"name every node resolves.", [0]) from None


def _serve(host: str, address: str, ports: list[int], timeout, me: str):
    busy = []
    for port in ports:
        try:
            store = bound_store(address, port, timeout.total_seconds())
        except (RuntimeError, OSError) as exc:  # torch's DistNetworkError is a RuntimeError
            if getattr(exc, "errno", None) == errno.EADDRNOTAVAIL:
                raise DistributedError(
                    f"MASTER_ADDR `{host}` ({address}) is not an address of "
                    f"{socket.gethostname()}, where rank 0 runs: its store can listen only "
                    f"on its own addresses. Unset MASTER_ADDR (the step's first host is "
                    f"used) or set it to this host.", [0]) from None
            if getattr(exc, "errno", None) != errno.EADDRINUSE and \
                    "in use" not in str(exc).lower():
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
    hung: dict[int, int] = {}  # port → probes a listener there left without a store's reply
    while time.monotonic() < deadline:
        for port in (p for p in ports if hung.get(p, 0) < STRIKES):
            client = _client(dist, host, port, world_size, PROBE_S * (1 + hung.get(port, 0)))
            if client is _SILENT:
                hung[port] = hung.get(port, 0) + 1
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


def _client(dist, host: str, port: int, world_size: int, wait: float):
    """A store client on host:port; None when nobody listens there (yet); _SILENT when a
    listener gave no store's reply within `wait` seconds — a program that is not a store,
    or a store on a machine too loaded to answer in time, so `_find` asks again, waiting
    longer, until STRIKES such answers. torch's client waits for a reply without a time
    limit, so it is made on a daemon thread, left behind (blocked on that socket) when
    silent: at most STRIKES times per port."""
    try:  # a connection refused, or not accepted within `wait`: nobody there (yet) — no
        # thread, no strike
        socket.create_connection((host, port), timeout=wait).close()
    except OSError:
        return None
    box: list = []

    def connect() -> None:
        try:
            box.append(dist.TCPStore(host, port, world_size, is_master=False,
                                     timeout=datetime.timedelta(seconds=wait),
                                     wait_for_workers=False))
        except (RuntimeError, OSError):  # it went away
            pass

    thread = threading.Thread(target=connect, name=f"phalanx-store-probe-{port}", daemon=True)
    thread.start()
    thread.join(wait + 1.0)
    if thread.is_alive():
        return _SILENT
    return box[0] if box else None
