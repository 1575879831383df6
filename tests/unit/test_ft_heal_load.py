"""A healing torchft group loads what a live group serves with `weights_only=True`
(torchft's own transport unpickles with `weights_only=False`: anything that reached the
unauthenticated lighthouse, or the checkpoint server's port, could make a healing group
run its code). Served here by a plain HTTP server on loopback."""

from __future__ import annotations

import http.server
import io
import pickle
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchft", reason="torchft is not installed (the `test` extra has it)")


class _Plant:
    """Unpickling it would create a file: the code a planted payload runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _serving(payload: bytes):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/checkpoint/1/full"


def _saved(obj) -> bytes:
    from torchft.checkpointing._serialization import _streaming_save

    buf = io.BytesIO()
    _streaming_save(obj, buf)
    return buf.getvalue()


def test_a_heal_runs_no_code_the_server_sends(tmp_path):
    from phalanx.ft.bind import _checkpoint_transport

    planted = tmp_path / "ran"
    transport = _checkpoint_transport("127.0.0.1", timedelta(seconds=10))
    server, url = _serving(_saved({"user": _Plant(str(planted))}))
    try:
        with pytest.raises(pickle.UnpicklingError, match="Unsupported global"):
            type(transport)._load_from_address(url, timedelta(seconds=10))
        assert not planted.exists()
    finally:
        server.shutdown()
        transport.shutdown(wait=False)


def test_a_groups_state_still_loads(tmp_path):
    from phalanx.ft.bind import load_weights_only

    state = {"user": {"model": {"w": torch.arange(4.0)},
                      "optimizer": {"state": {0: {"step": torch.tensor(3.0)}},
                                    "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95),
                                                      "params": [0], "name": None}]},
                      "train": {"step": 7, "tokens_seen": 1024, "losses": [1.5, 1.25]}},
             "torchft": {"step": 7, "batches_committed": 14}}
    server, url = _serving(_saved(state))
    try:
        got = load_weights_only(url, timedelta(seconds=10))
    finally:
        server.shutdown()
    assert torch.equal(got["user"]["model"]["w"], torch.arange(4.0))
    assert got["user"]["train"] == state["user"]["train"] and got["torchft"] == state["torchft"]
