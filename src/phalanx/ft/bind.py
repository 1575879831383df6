"""Where a replica group's torchft servers listen: on one address, never every interface.

torchft (0.2) offers no way to choose: its `Manager` binds the manager server on
`[::]:PORT`, and its HTTP checkpoint transport — which, on a heal, serves the whole model
and optimizer state, unauthenticated — on `("", 0)`; both advertise the host name.
`bound_manager` builds the Manager with both bound to, and advertised as, `host`:
loopback on one machine, the address towards the lighthouse across machines
(`listen_host`), as the rest of Phalanx binds (docs/security.md). The transport is
torchft's own `HTTPTransport` (given to the Manager through its `checkpoint_transport`
argument) with its server class bound; the manager server is torchft's own
`ManagerServer`, given `host` as its bind while the Manager is built. Each replaced name
must exist (`mock.patch.object` raises otherwise), and tests/e2e/test_torchft.py lists
every socket a job listens on.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any
from unittest import mock

LOOPBACK = "127.0.0.1"


def listen_host(lighthouse: str, local: bool) -> str:
    """Where this group's servers listen: loopback when the launcher's own lighthouse is
    on loopback (`local`), else this machine's address towards `lighthouse` (a URL)."""
    if local:
        return LOOPBACK
    from phalanx.cluster.nodes import route_to
    from phalanx.config.dist import endpoint

    host, port = endpoint(lighthouse.removeprefix("http://").rstrip("/"), "--lighthouse")
    return route_to(host, port, "--lighthouse", "the lighthouse")


def in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def bound_manager(host: str, timeout: timedelta, **kwargs: Any):
    """torchft's `Manager(timeout=timeout, **kwargs)` with its manager server and its
    checkpoint server listening on `host` only, and advertised as `host`."""
    import torchft.manager
    from torchft import Manager

    transport = _checkpoint_transport(host, timeout)
    real = torchft.manager.ManagerServer

    def server(**args: Any):  # the Manager passes every argument by name
        port = args["bind"].rpartition(":")[2]
        return real(**{**args, "bind": f"{in_url(host)}:{port}"})

    try:
        with mock.patch.object(torchft.manager, "ManagerServer", server):
            return Manager(timeout=timeout, hostname=host, checkpoint_transport=transport,
                           **kwargs)
    except BaseException:
        transport.shutdown(wait=False)
        raise


def _checkpoint_transport(host: str, timeout: timedelta):
    """torchft's HTTP checkpoint transport, its server on `host` (a free port)."""
    from torchft.checkpointing import HTTPTransport, http_transport

    base = http_transport._IPv6HTTPServer

    class Server(base):  # type: ignore[misc, valid-type]
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def __init__(self, address, handler, bind_and_activate: bool = True) -> None:
            super().__init__((host, address[1]), handler, bind_and_activate)

    class Transport(HTTPTransport):
        def address(self) -> str:  # where the others fetch from: `host`, not the host name
            return f"http://{in_url(host)}:{self._server.socket.getsockname()[1]}/checkpoint/"

        @classmethod
        def _load_from_address(cls, address: str, timeout: timedelta) -> object:
            return load_weights_only(address, timeout)

    with mock.patch.object(http_transport, "_IPv6HTTPServer", Server):
        return Transport(timeout=timeout, num_chunks=0)


def load_weights_only(address: str, timeout: timedelta) -> object:
    """What a healing group fetches from a live one (torchft's `_load_from_address`, which
    unpickles with `weights_only=False`: any process that reached the unauthenticated
    lighthouse could make a healing group run its code) — loaded with `weights_only=True`:
    tensors, numbers, strings and containers, never code. A group's state is only those
    (`ft.replica.ReplicaGroup._save`)."""
    import urllib.request

    from torchft.checkpointing._serialization import _streaming_load

    with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
        return _streaming_load(f, weights_only=True)
