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

What goes wrong while machines meet is one line naming the host and the endpoint, not
torch's traceback: a port another launcher holds (`_serve`), a timeout with how many
nodes arrived (`_give_up`), a store that went away (`_lost`), and a node refused before
it joined (a second node rank 0, phalanx.cluster.nodes) — it leaves a note in the store
(`tell_host`), so the nodes waiting there stop at once with its cause (`_backend`).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import socket
import time

from phalanx.cluster.protocol import LAST_FAILURE, ROUND
from phalanx.errors import DistributedError, UserError

BACKEND = "phalanx-c10d"


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
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    timeout_s = float(params.get_as_int("read_timeout", 60))
    is_host = params.get_as_bool("is_host", True)  # one node: always; several: node 0
    store = _serve(host, port, timeout_s, params) if is_host else _client(host, port, params)
    backend = _backend(store, params.run_id)
    handler = create_handler(store, backend, params)
    _watch(handler, backend, params, store, is_host)
    if hasattr(handler, "_create_tcp_store_server"):  # torch >= 2.4: the shared agent store
        # bound to the address this node advertises (--local-addr): loopback for one node
        serve = lambda addr, port: bound_store(addr, port, timeout_s)
        # a private torch method replaced on the instance: not what torch's types allow
        handler._create_tcp_store_server = serve  # type: ignore[method-assign]
    return handler


def _serve(host: str, port: int, timeout_s: float, params):
    """The rendezvous store this node serves at the endpoint, or one line saying why not
    (its port held by another launcher on this host: a second node 0)."""
    try:
        return bound_store(host, port, timeout_s)
    except OSError as exc:

        me, rank = socket.gethostname(), params.get_as_int("node_rank", -1)
        if exc.errno != errno.EADDRINUSE:
            raise UserError(f"{me} cannot serve the rendezvous at {host}:{port} "
                            f"(`--rdzv-endpoint`): {exc.strerror or exc}. Give an address "
                            f"and a free port of node 0's host.") from None
        who = (f"this launcher on {me} is node rank 0" if rank == 0 else
               f"this launcher on {me} holds the endpoint's address and has no "
               f"`--node-rank`")
        raise UserError(f"port {port} of {host} is already in use: {who}, so it serves the "
                        f"rendezvous there, but another launcher (a second node rank 0?) or "
                        f"another program holds the port. Give each "
                        f"host its own `--node-rank` (0 on the endpoint's host {host}, which "
                        f"runs one launcher); to run several ranks on one machine, use "
                        f"`--nproc-per-node` instead of several launchers.") from None


def _refused_key(run_id: str) -> str:
    return f"/phalanx/{run_id}/refused"


def tell_host(host: str, port: int, run_id: str, message: str, wait_s: float = 2.0) -> None:
    """Best effort: leave `message` in the rendezvous store at host:port, so that the
    nodes waiting there stop in one line too (`_backend`) instead of at the timeout."""
    import torch.distributed as dist

    try:
        store = dist.TCPStore(host, port, is_master=False, use_libuv=True,
                              timeout=datetime.timedelta(seconds=wait_s))
        store.set(_refused_key(run_id), message)
    except (RuntimeError, TimeoutError, ValueError, OSError):
        pass  # nobody serves it yet: they stop at the timeout, naming the endpoint


def _backend(store, run_id: str):
    """torch's c10d backend under Phalanx's name; while a node waits for the others
    (`watching`), a message a refused node left in the store stops it in one line."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    class Backend(C10dRendezvousBackend):
        name = BACKEND
        watching = False

        def get_state(self):
            if self.watching:
                _raise_refusal(store, run_id)
            return super().get_state()

    return Backend(store, run_id)


def _raise_refusal(store, run_id: str) -> None:
    key = _refused_key(run_id)
    try:
        said = store.get(key).decode() if store.check([key]) else None
    except (RuntimeError, TimeoutError, ValueError):
        return  # the store is gone: torch's own call says so next
    if said:

        me = socket.gethostname()
        raise UserError(f"the rendezvous stopped on {me}: {said}")


def _watch(handler, backend, params, store, is_host: bool) -> None:
    """Each rendezvous of `handler`: a timeout or a lost store is one line naming the
    endpoint and what to check, not torch's traceback; after it, the round number goes
    into this agent's environment, which the workers it then starts inherit
    (`attempt_store`). Every node of a round has the same number;
    TORCHELASTIC_RESTART_COUNT is per agent, and an agent that restarts its healthy
    workers because another node failed does not count a restart — with several
    machines the two would then wait in different key spaces forever (seen: gloo's init
    hung after a rank was killed on one of two machines)."""
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    inner, waiting = handler.next_rendezvous, handler.num_nodes_waiting
    arrived = _arrivals(handler)

    def next_rendezvous(*args, **kwargs):
        arrived.clear()
        backend.watching = True
        try:
            info = inner(*args, **kwargs)
        except RendezvousTimeoutError:
            raise _give_up(params, arrived, store, is_host) from None
        except RendezvousConnectionError:
            raise _lost(params) from None
        finally:
            backend.watching = False
        if is_host:  # a refusal is about the round it came in, not the next one
            with contextlib.suppress(RuntimeError, TimeoutError, ValueError):
                store.delete_key(_refused_key(params.run_id))
        state = getattr(getattr(handler, "_state_holder", None), "state", None)
        if state is not None and hasattr(state, "round"):
            os.environ[ROUND] = str(state.round)
        return info

    def num_nodes_waiting():  # polled while the workers run
        try:
            return waiting()
        except RendezvousConnectionError:
            raise _lost(params) from None

    handler.next_rendezvous, handler.num_nodes_waiting = next_rendezvous, num_nodes_waiting


def _arrivals(handler) -> set:
    """The nodes seen in the round being formed, updated at every poll of the store
    (empty when torch's internals differ: the message then gives no count)."""
    seen: set = set()
    holder = getattr(handler, "_state_holder", None)
    if holder is None or not hasattr(holder, "sync"):
        return seen
    sync = holder.sync

    def counting_sync():
        result = sync()
        state = getattr(holder, "state", None)
        forming = getattr(state, "wait_list" if getattr(state, "complete", False) else
                          "participants", ())
        seen.update(forming)
        if forming and getattr(handler, "_this_node", None) is not None:
            seen.add(handler._this_node)
        return result
    holder.sync = counting_sync
    return seen


def _timed_out(params, arrived: set, where: str) -> str:
    """`timed out on HOST after S s: 1 of 2 node(s) arrived (from ...). Check ...`"""
    wait = params.get_as_int("join_timeout", 600)
    low, high = params.min_nodes, params.max_nodes
    nnodes = str(low) if low == high else f"{low}:{high}"
    host, _, port = params.endpoint.rpartition(":")
    count = (f"{len(arrived)} of {low} node(s) arrived (from "
             f"{', '.join(sorted(str(getattr(n, 'addr', n)) for n in arrived))})"
             if arrived else f"fewer than {low} node(s) arrived")
    return (f"timed out {where} after {wait:g} s: {count}. Check that every other host runs "
            f"the same command (`--nnodes {nnodes} --rdzv-endpoint {params.endpoint} "
            f"--rdzv-id {params.run_id}`, each with its own `--node-rank`), that port {port} "
            f"of {host} is open to them (a firewall), and that `--nnodes` is the number of "
            f"machines you start (or raise `--rdzv-timeout-s`).")


def _give_up(params, arrived: set, store, is_host: bool):
    """The UserError for a rendezvous that timed out here. The host of the store first
    leaves it for the nodes that did arrive, and waits for them to read it (they poll
    every second): they stop with the same cause, not with a lost connection."""

    me = socket.gethostname()
    if is_host and len(arrived) > 1:
        with contextlib.suppress(RuntimeError, TimeoutError, ValueError):
            store.set(_refused_key(params.run_id),
                      f"the rendezvous host {me} " + _timed_out(params, arrived, "there"))
            time.sleep(2.5)
    return UserError(f"the rendezvous at {params.endpoint} "
                     + _timed_out(params, arrived, f"on {me}"))


def _lost(params):
    return DistributedError(
        f"{socket.gethostname()} lost the connection to the rendezvous store at "
        f"{params.endpoint}: the launcher that serves it (node 0, on the endpoint's host) "
        f"stopped — see its output — or that host became unreachable. Start every host "
        f"again.")


def _client(host: str, port: int, params):
    """A client of node 0's rendezvous store; waits up to the join timeout for it, then
    one line naming the endpoint."""
    import torch.distributed as dist

    wait = float(params.get_as_int("join_timeout", 600))
    try:
        return dist.TCPStore(host, port, is_master=False, use_libuv=True,
                             timeout=datetime.timedelta(seconds=wait))
    except (RuntimeError, TimeoutError, ValueError) as exc:

        raise UserError(f"cannot reach the rendezvous at {host}:{port} within {wait:g} s "
                        f"from {socket.gethostname()} (`--rdzv-endpoint`, "
                        f"`--rdzv-timeout-s`): is node 0's `phalanx` running with the same "
                        f"endpoint, and is the port open between the machines? "
                        f"({str(exc).splitlines()[0][:120]})") from None


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


def restart_note() -> str | None:
    """In a restarted worker: `restart 1 of at most 3 after rank 1 was killed by SIGKILL`
    (None on a job's first attempt)."""
    attempt = restart_attempt()
    if not attempt:
        return None
    cause = os.environ.get(LAST_FAILURE) or "a rank failed"
    return (f"restart {attempt} of at most "
            f"{os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')} after {cause}")
