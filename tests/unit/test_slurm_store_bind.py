"""Under plain `srun`, rank 0's store listens on the address the other tasks connect to
(MASTER_ADDR as rank 0's host resolves it), not on every interface — read back from the
kernel's table of listening sockets (/proc/net/tcp, tcp6)."""

from __future__ import annotations

import datetime
import os
import random
import socket
import struct
from pathlib import Path

import pytest

from phalanx.cluster import slurm_store
from phalanx.errors import DistributedError


def listening(port: int) -> set[str]:
    """The addresses a socket listens on at `port` (TCP state 0A: LISTEN)."""
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)  # each 32-bit word in host (little-endian) order
            words = b"".join(struct.pack("<I", w) for w in struct.unpack(f">{len(raw) // 4}I",
                                                                         raw))
            found.add(socket.inet_ntop(family, words))
    return found


def srun_env(monkeypatch, master_addr: str) -> None:
    job = random.randrange(10**5, 10**6)
    for name, value in {"MASTER_ADDR": master_addr, "MASTER_PORT": "0",
                        "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0",
                        "SLURM_STEP_NODELIST": "localhost"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_STEP_RESV_PORTS", raising=False)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_rank_zeros_store_listens_on_master_addr_only(monkeypatch):
    srun_env(monkeypatch, "127.0.0.1")
    store = slurm_store.srun_store(0, 2, datetime.timedelta(seconds=30))
    port = int(os.environ["MASTER_PORT"])
    try:
        assert listening(port) == {"127.0.0.1"}  # not 0.0.0.0 / ::
    finally:
        del store


def test_a_master_addr_that_is_not_this_host_is_named(monkeypatch):
    srun_env(monkeypatch, "192.0.2.7")  # TEST-NET-1: no machine's address
    with pytest.raises(DistributedError, match=r"\[rank 0\] MASTER_ADDR `192\.0\.2\.7` "
                                               r"\(192\.0\.2\.7\) is not an address of"):
        slurm_store.srun_store(0, 2, datetime.timedelta(seconds=5))


def test_a_name_that_resolves_to_loopback_here_listens_towards_the_other_hosts(monkeypatch):
    """`127.0.1.1 node1` in rank 0's /etc/hosts, while node2 resolves node1 to its network
    address: loopback would shut node2 out, so the address towards node2 is used."""
    names = {"node1": "127.0.1.1", "node2": "127.0.0.2"}
    monkeypatch.setattr(socket, "gethostbyname", names.__getitem__)
    one_node = {"MASTER_ADDR": "node1", "SLURM_STEP_NODELIST": "node1"}
    assert slurm_store.listen_address(one_node, 20000) == "127.0.1.1"
    two_nodes = {"MASTER_ADDR": "node1", "SLURM_STEP_NODELIST": "node[1-2]"}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("127.0.0.2", 20000))
        towards = s.getsockname()[0]
    assert slurm_store.listen_address(two_nodes, 20000) == towards


class _SlowFirst:
    """torch.distributed, except that the first store client made on `port` does not
    answer in time (a store on a machine too loaded to reply within the probe); `calls`
    counts the clients made, per port."""

    def __init__(self, port: int, delay: float) -> None:
        import time

        import torch.distributed as dist

        self.port, self.delay, self.sleep, self.dist = port, delay, time.sleep, dist
        self.calls: dict[int, int] = {}

    def TCPStore(self, host, port, *args, **kwargs):  # noqa: N802 - torch's name
        self.calls[port] = self.calls.get(port, 0) + 1
        if port == self.port and self.calls[port] == 1:
            self.sleep(self.delay)
        return self.dist.TCPStore(host, port, *args, **kwargs)


def test_a_store_slow_to_answer_once_is_asked_again_and_nobody_listening_is_no_strike(
        monkeypatch):
    """A store whose first reply comes too late is not given up: it is asked again (the
    multi-host SLURM test hung once under load with every rank-0 port given up), and a port
    where nobody listens costs no store client (the connection is refused)."""
    import torch.distributed as dist

    monkeypatch.setattr(slurm_store, "PROBE_S", 0.2)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=10))
    store.set(slurm_store.OWNER, "7.0")
    slow = _SlowFirst(store.port, delay=2.0)
    client, found = slurm_store._find(slow, "127.0.0.1", [free, store.port], 2,
                                      datetime.timedelta(seconds=8), "7.0", 1)
    assert found == store.port and client.get(slurm_store.OWNER) == b"7.0"
    assert slow.calls[store.port] >= 2 and free not in slow.calls  # late, then taken
