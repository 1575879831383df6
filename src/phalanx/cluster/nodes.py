"""More than one machine: where this node meets the others, and which of its addresses
and interfaces the job uses (torch's elastic agent does the rendezvous itself).

One node binds everything to loopback (see phalanx.cluster.rendezvous); several nodes bind to
the address this machine uses to reach the rendezvous endpoint — not to every
interface — and gloo uses that address's interface (GLOO_SOCKET_IFNAME).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass

from phalanx.cluster.rendezvous import tell_host
from phalanx.config.sections import DistConfig, endpoint
from phalanx.errors import UserError

SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class NodePlan:
    min_nodes: int
    max_nodes: int
    endpoint: str  # HOST:PORT
    run_id: str
    local_addr: str  # this machine's address towards the endpoint
    ifname: str | None  # the interface that holds local_addr
    is_host: bool  # this machine hosts the rendezvous store
    node_rank: int | None
    timeout_s: float

    @property
    def label(self) -> str:
        rank = f"node {self.node_rank}" if self.node_rank is not None else "a node"
        nodes = str(self.max_nodes) if self.min_nodes == self.max_nodes else \
            f"{self.min_nodes}-{self.max_nodes}"
        return (f"{rank} of {nodes} ({socket.gethostname()}, {self.local_addr}"
                f"{' on ' + self.ifname if self.ifname else ''}), rendezvous at "
                f"{self.endpoint}{' (hosted here)' if self.is_host else ''}")


def interface_addresses() -> dict[str, str]:
    """{IPv4 address: interface name} for this machine's interfaces."""
    found = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR,
                                  struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
        found[socket.inet_ntoa(raw[20:24])] = name
    return found


def route_to(host: str, port: int, flag: str = "--rdzv-endpoint",
             what: str = "node 0") -> str:
    """The local address this machine would use to reach host:port (no packet is sent);
    `host` may be an IPv6 address, bracketed or not."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        with socket.socket(socket.AF_INET6 if ":" in bare else socket.AF_INET,
                           socket.SOCK_DGRAM) as s:
            s.connect((bare, port))
            return s.getsockname()[0]
    except OSError as exc:
        raise UserError(f"`{flag} {host}:{port}`: no route from this machine "
                        f"({exc.strerror or exc}). Give an address of {what} that this "
                        f"machine can reach.") from None


def is_local(address: str) -> bool:
    """Whether `address` is one of this machine's own (a socket can be bound to it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def node_plan(d: DistConfig) -> NodePlan | None:
    """None for one machine; else where and how this node joins."""
    low, high = d.node_range()
    if high == 1:
        return None
    host, port = endpoint(d.rdzv_endpoint or "")
    try:
        target = socket.gethostbyname(host)
    except OSError:
        raise UserError(f"`--rdzv-endpoint {d.rdzv_endpoint}`: cannot resolve `{host}` on "
                        f"{socket.gethostname()}. Use an IP address or a name every machine "
                        f"resolves.") from None
    local = route_to(target, port)
    at_endpoint = is_local(target)
    _check_node_rank(d, target, port, local, at_endpoint, high)
    is_host = d.node_rank == 0 if d.node_rank is not None else at_endpoint
    return NodePlan(low, high, f"{target}:{port}", d.rdzv_id, local,
                    interface_addresses().get(local), is_host, d.node_rank, d.rdzv_timeout_s)


def _others(high: int) -> str:
    return "`--node-rank 1`" if high == 2 else f"`--node-rank` 1 .. {high - 1} (one each)"


def _check_node_rank(d: DistConfig, target: str, port: int, local: str, at_endpoint: bool,
                     high: int) -> None:
    """Node rank 0 serves the rendezvous, so it runs on the endpoint's host and no other
    node rank does (on a loopback endpoint every node is on this machine: a trial)."""
    me, given = socket.gethostname(), f"`--rdzv-endpoint {d.rdzv_endpoint}`"
    if d.node_rank == 0 and not at_endpoint:

        said = (f"{me} ({local}) was started with `--node-rank 0` too and stopped: two "
                f"launchers claim node rank 0, which must run on the endpoint's host "
                f"{target}. Start {me} again with {_others(high)}, and the other host(s) "
                f"again as they were.")
        tell_host(target, port, d.rdzv_id, said)  # its launcher stops too, in one line
        raise UserError(f"`--node-rank 0` on {me} ({local}), but node rank 0 serves the "
                        f"rendezvous and must run on the endpoint's host {target} ({given}). "
                        f"Start the host at {target} with `--node-rank 0` and this one with "
                        f"{_others(high)}.")
    if d.node_rank and at_endpoint and not ipaddress.ip_address(target).is_loopback:
        raise UserError(f"`--node-rank {d.node_rank}` on {me}, but {me} holds the endpoint's "
                        f"address {target} ({given}), where node rank 0 must run: it serves "
                        f"the rendezvous. Start this host with `--node-rank 0` and the other "
                        f"host(s) with {_others(high)} (to run several ranks on one machine, "
                        f"use `--nproc-per-node` instead of several launchers).")
