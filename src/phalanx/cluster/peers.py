"""Which machine each rank runs on, gathered once when the job starts, so that errors
about another rank can name it and its host: gloo says only "Connection closed by peer
[10.77.0.2]:6017", which this turns into "rank 1 on node-b (10.77.0.2)".
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass

from phalanx.cluster.nodes import interface_addresses

_PEER = re.compile(r"\[([0-9a-fA-F.:]+)\]:\d+")  # gloo: "... [10.77.0.2]:6017 ..."


@dataclass(frozen=True)
class Peers:
    hosts: tuple[str, ...]  # rank -> host name
    addresses: tuple[frozenset[str], ...]  # rank -> its machine's IPv4 addresses

    @property
    def machines(self) -> int:
        return len(set(self.hosts))

    def host(self, rank: int) -> str:
        return self.hosts[rank] if 0 <= rank < len(self.hosts) else "?"

    def at(self, address: str, me: int) -> str | None:
        """`rank 1 on node-b (10.77.0.2)` for the ranks (other than `me`) on the machine
        that holds `address`; None on one machine, where it names nobody in particular."""
        ranks = [r for r, held in enumerate(self.addresses) if address in held and r != me]
        if self.machines < 2 or not ranks:
            return None
        names = sorted({self.hosts[r] for r in ranks})
        who = f"rank {ranks[0]}" if len(ranks) == 1 else \
            f"one of ranks {', '.join(map(str, ranks))}"
        return f"{who} on {', '.join(names)} ({address})"

    def lost(self, text: str, me: int) -> str | None:
        """Who a connection error in `text` (gloo's '[ADDRESS]:PORT') is about."""
        found = _PEER.search(text)
        return self.at(found.group(1), me) if found else None


def local_addresses() -> frozenset[str]:
    """This machine's IPv4 addresses (loopback included: ranks of one machine meet there)."""

    try:
        return frozenset(interface_addresses())
    except OSError:
        return frozenset()


def gather_peers(world_size: int) -> Peers:
    """Every rank's host and addresses (one small all-gather over the default group)."""
    import torch.distributed as dist

    mine = (socket.gethostname(), local_addresses())
    if world_size == 1:
        return Peers((mine[0],), (mine[1],))
    table: list = [None] * world_size
    dist.all_gather_object(table, mine)
    return Peers(tuple(t[0] for t in table), tuple(t[1] for t in table))
