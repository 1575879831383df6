"""Naming the rank and host behind gloo's peer address (phalanx.cluster.peers)."""

from __future__ import annotations

import pytest

from phalanx.cluster.peers import Peers, gather_peers, local_addresses
from phalanx.hang.mismatch import peer_lost

LO = "127.0.0.1"
TWO_MACHINES = Peers(("node-a", "node-a", "node-b", "node-b"),
                     tuple(frozenset({LO, a}) for a in
                           ("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2")))
GLOO = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by "
        "peer [{}]:53153. This is typically caused by a remote worker crashing.")


def test_the_machine_behind_an_address_is_named_with_its_ranks():
    assert TWO_MACHINES.at("10.0.0.2", me=0) == "one of ranks 2, 3 on node-b (10.0.0.2)"
    assert TWO_MACHINES.at("10.0.0.1", me=0) == "rank 1 on node-a (10.0.0.1)"
    assert TWO_MACHINES.at("10.9.9.9", me=0) is None
    assert TWO_MACHINES.lost(GLOO.format("10.0.0.2"), me=1) == \
        "one of ranks 2, 3 on node-b (10.0.0.2)"
    assert TWO_MACHINES.lost("Read error [10.0.0.1]:6017: Connection reset by peer", me=3) == \
        "one of ranks 0, 1 on node-a (10.0.0.1)"
    assert TWO_MACHINES.lost("no address here", me=0) is None


def test_one_machine_names_nobody_in_particular():
    one = Peers(("h", "h"), (frozenset({LO}), frozenset({LO})))
    assert one.at(LO, me=0) is None and one.lost(GLOO.format(LO), me=0) is None


def test_a_lost_peer_error_names_it():
    err = peer_lost(RuntimeError(GLOO.format("10.0.0.2")), 0, TWO_MACHINES)
    assert "lost the connection to one of ranks 2, 3 on node-b (10.0.0.2) in a collective" \
        in str(err)
    err = peer_lost(RuntimeError(GLOO.format("10.0.0.2")), 0)
    assert "lost the connection to another rank" in str(err)


def test_one_process_gathers_itself():
    peers = gather_peers(1)
    assert len(peers.hosts) == 1 and peers.addresses[0] == local_addresses()
    assert LO in local_addresses() or pytest.skip("no loopback address on this machine")
