"""Small helpers the tests share: a free local port, and whether two runs' models are the
same bit for bit."""

from __future__ import annotations

import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def same_model(a: Path, b: Path) -> bool:
    """Whether run directories `a` and `b` hold the same `model.safetensors`: the same
    tensor names, every tensor equal bit for bit."""
    import torch
    from safetensors.torch import load_file

    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
