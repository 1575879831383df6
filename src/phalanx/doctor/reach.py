"""Can every machine reach every other one where the collectives will connect?

The rendezvous working proves only that each machine reaches the store's host. Gloo (and
NCCL's bootstrap) then connect every rank to every other on the address of the interface
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME names (or the route towards the store): a firewall
or an interface other machines cannot route to makes the process group hang at init, and
torch's timeout names nobody. Before the group is made, each rank listens on that address
and publishes it on the job's store; each then connects to one rank of every other
machine, and rank 0 gathers who could not reach whom.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import timedelta

from phalanx.cluster.nodes import interface_addresses, route_to

CONNECT_TIMEOUT_S = 5.0


def collective_address(backend_var: str = "GLOO_SOCKET_IFNAME") -> tuple[str | None, str]:
    """(address, how it was chosen) — where this rank's collectives will listen; address
    None with the reason when the variable names an interface this machine lacks."""

    ifname = os.environ.get(backend_var, "").split(",")[0]
    if ifname:
        by_name = {name: addr for addr, name in interface_addresses().items()}
        if ifname not in by_name:
            return None, f"{backend_var}={ifname} names no IPv4 interface here " \
                         f"(there are: {', '.join(sorted(by_name))})"
        return by_name[ifname], f"{backend_var}={ifname}"
    return route_to(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), \
        "the route to the store's host"


def probe(store, rank: int, world: int, timeout_s: float,
          backend_var: str = "GLOO_SOCKET_IFNAME") -> tuple[list[str], int]:
    """(problems, machines): who cannot reach whom ('node-b cannot reach node-a at …'),
    the same on every rank, and how many machines took part."""
    host = socket.gethostname()
    address, how = collective_address(backend_var)
    server = socket.create_server((address, 0), backlog=max(16, world)) if address else None
    try:
        port = server.getsockname()[1] if server else 0
        store.set(f"reach/at/{rank}", json.dumps([host, address, port, how]))
        table = _read_all(store, "reach/at", world, timeout_s)
        failed = _connect_each_machine(table, host) if address else {"*": how}
        store.set(f"reach/result/{rank}", json.dumps(failed))
        results = _read_all(store, "reach/result", world, timeout_s)
    finally:
        if server is not None:
            server.close()
    return _problems(table, results), len({entry[0] for entry in table})


def _read_all(store, prefix: str, world: int, timeout_s: float) -> list:
    keys = [f"{prefix}/{r}" for r in range(world)]
    store.wait(keys, timedelta(seconds=timeout_s))
    return [json.loads(store.get(k)) for k in keys]


def _connect_each_machine(table: list, me: str) -> dict[str, str]:
    """{other host: why it cannot be reached} for the first rank of every other machine."""
    first: dict[str, list] = {}
    for entry in table:
        first.setdefault(entry[0], entry)
    failed = {}
    for host, (_, address, port, how) in first.items():
        if host == me or address is None:
            continue  # a machine without the interface reports that itself
        try:
            socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            why = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
            failed[host] = f"{address}:{port} ({how} there): {why}"
    return failed


def _problems(table: list, results: list) -> list[str]:
    found: dict[str, None] = {}  # ordered, one line per pair of machines
    for (host, *_), failed in zip(table, results):
        for target, why in failed.items():
            line = f"{host}: {why}" if target == "*" else f"{host} cannot reach {target} at {why}"
            found[line] = None
    return list(found)
