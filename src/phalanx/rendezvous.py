"""torch's c10d rendezvous, with stores that listen only where they should.

A `TCPStore` server binds every interface of the machine, whatever host name it is
given, and it has no authentication (PyTorch's SECURITY.md: run jobs on a trusted
network): anyone who reaches the port can read and write the job's keys. A single-node
job has no reason to be reachable from anywhere but the machine itself.

Phalanx therefore registers `phalanx-c10d`: torch's own dynamic rendezvous
(`create_handler`) on torch's own `C10dRendezvousBackend`, whose TCPStore — and the
agent's store that the workers share (`TORCHELASTIC_USE_AGENT_STORE`) — are given a
socket that Phalanx bound to the one address the job uses (`master_listen_fd`), so
they listen there and nowhere else. Nothing of the rendezvous protocol is Phalanx's.
Workers reach the agent's store through `attempt_store`, one key space per restart.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket

BACKEND = "phalanx-c10d"
ROUND = "PHALANX_RDZV_ROUND"  # the rendezvous round the workers were started in


def bound_store(host: str, port: int, timeout_s: float = 60.0):
    """A TCPStore server listening on `host`:`port` only (port 0: the OS picks)."""
    import torch.distributed as dist

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()  # handed to the store before it exists: a Ctrl-C arriving just
    try:  # after its constructor must not close a descriptor the store then owns
        return dist.TCPStore(host, port, is_master=True, use_libuv=True,
                             timeout=datetime.timedelta(seconds=timeout_s),
                             master_listen_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):  # closed by the store already
            os.close(fd)
        raise


def _create_handler(params):
    """The `phalanx-c10d` handler: torch's dynamic rendezvous over torch's c10d backend,
    its stores bound to the endpoint's address."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
        C10dRendezvousBackend)
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    timeout_s = float(params.get_as_int("read_timeout", 60))
    is_host = params.get_as_bool("is_host", True)  # one node: always; several: node 0
    store = bound_store(host, port, timeout_s) if is_host else _client(host, port, params)
    class Backend(C10dRendezvousBackend):  # torch's backend under the name it was asked by
        name = BACKEND

    handler = create_handler(store, Backend(store, params.run_id), params)
    _publish_round(handler)
    if hasattr(handler, "_create_tcp_store_server"):  # torch >= 2.4: the shared agent store
        # bound to the address this node advertises (--local-addr): loopback for one node
        handler._create_tcp_store_server = lambda addr, port: bound_store(addr, port,
                                                                          timeout_s)
    return handler


def _publish_round(handler) -> None:
    """After each rendezvous, put its round number in this agent's environment, which
    the workers it then starts inherit (`attempt_store`). Every node of a round has the
    same number; TORCHELASTIC_RESTART_COUNT is per agent, and an agent that restarts its
    healthy workers because another node failed does not count a restart — with several
    machines the two would then wait in different key spaces forever (seen: gloo's init
    hung after a rank was killed on one of two machines)."""
    inner = handler.next_rendezvous

    def next_rendezvous(*args, **kwargs):
        info = inner(*args, **kwargs)
        state = getattr(getattr(handler, "_state_holder", None), "state", None)
        if state is not None and hasattr(state, "round"):
            os.environ[ROUND] = str(state.round)
        return info
    handler.next_rendezvous = next_rendezvous


def _client(host: str, port: int, params):
    """A client of node 0's rendezvous store; waits up to the join timeout for it, then
    one line naming the endpoint."""
    import torch.distributed as dist

    wait = float(params.get_as_int("join_timeout", 600))
    try:
        return dist.TCPStore(host, port, is_master=False, use_libuv=True,
                             timeout=datetime.timedelta(seconds=wait))
    except (RuntimeError, TimeoutError, ValueError) as exc:
        from phalanx.errors import UserError

        raise UserError(f"cannot reach the rendezvous at {host}:{port} within {wait:g} s "
                        f"(`--rdzv-endpoint`, `--rdzv-timeout-s`): is node 0's `phalanx` "
                        f"running with the same endpoint, and is the port open between the "
                        f"machines? ({str(exc).splitlines()[0][:120]})") from None


def register() -> str:
    """Make `phalanx-c10d` known to torch's rendezvous registry (idempotent)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND, _create_handler)
    return BACKEND


def restart_attempt() -> int:
    """0 for the workers of a job's first start, N after the N-th restart (the same number
    on every machine: the rendezvous round, when the agent is Phalanx's)."""
    value = os.environ.get(ROUND) or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(value) if value.isdigit() else 0


def attempt_store(world_size: int, timeout: datetime.timedelta):
    """Under torch's elastic agent, a store namespaced by the restart attempt.

    After an elastic restart the workers reuse the agent's TCPStore, which still holds
    the dead workers' gloo addresses: a plain init then fails ("Gloo connectFullMesh
    failed … Connection refused") or hangs. A PrefixStore per attempt keeps every
    attempt's keys apart. Outside the agent: None (torch's env:// rendezvous).
    """
    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    attempt = restart_attempt()
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                           world_size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"/phalanx/attempt-{attempt}", client)
