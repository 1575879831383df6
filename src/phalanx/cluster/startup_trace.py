"""`PHALANX_STARTUP_TRACE=FILE`: each process appends `<unix time> <pid> <label>` as it
passes a milestone of the start-up (benchmarks/startup.py reads them). Nothing is
written when the variable is unset."""

from __future__ import annotations

import os
import time

from phalanx.cluster import protocol


def _role() -> str:
    return "worker" if protocol.phalanx_worker() else "launcher"


def process_started(pid: int | str = "self") -> float:
    """When process `pid` (default: this one) started (Linux: its age from /proc, to
    10 ms), else now."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def mark(label: str, at=None) -> None:
    """Record that this process reached `label` (now, or at the time `at()` gives — only
    asked when tracing)."""
    path = os.environ.get(protocol.STARTUP_TRACE)
    if not path:
        return
    when = time.time() if at is None else at()
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{when:.3f} {os.getpid()} {_role()}: {label}\n")
