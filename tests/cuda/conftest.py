"""The CUDA tier: every test here needs one CUDA GPU and is skipped, with its reason,
without one — the CPU suite never depends on it. Run it with

    python -m pytest -m cuda tests/cuda

Each scenario runs in a process of its own (`worker.py`). A test that measures something
records it with the `figure` fixture: to the JSON-lines file named by
PHALANX_GPU_FIGURES when set (benchmarks/gpu_suite.py reads it), else nowhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cuda_helpers import FIGURES, HERE, no_gpu_reason


def pytest_collection_modifyitems(config, items):
    reason = no_gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture
def figure(request):
    """figure(name, **values): record a measured figure of this test."""

    def record(name: str, **values) -> None:
        path = os.environ.get(FIGURES)
        if path:
            with open(path, "a") as fh:
                fh.write(json.dumps({"test": request.node.nodeid, "figure": name,
                                     **values}, default=str) + "\n")
    return record
