"""Process trees read from /proc: which processes a launcher started, and whether they
are still alive (the tests for orphans and listening sockets); `watch`, a script run
under `phalanx watch` on 2 ranks (the hang tests and the hang corpus)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def watch(script: Path, *args: str, cwd: Path, timeout: float = 180, ranks: int = 2,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`phalanx watch --nproc-per-node RANKS --report-dir CWD ARGS SCRIPT`, one thread a
    rank; `env`: variables added to this process's."""
    return subprocess.run([sys.executable, "-m", "phalanx", "watch", "--nproc-per-node",
                           str(ranks), "--report-dir", str(cwd), *args, str(script)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def descendants(pid: int) -> set[int]:
    """Every process whose chain of parents leads to `pid`."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    """The ones among `pids` that still run (zombies count as gone)."""
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def gone_within(pids: set[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pids)


def wait_for_step(lines, step: int) -> bool:
    """Read a run's stdout lines until rank 0's progress reports `step`; False if the
    output ended first."""
    for line in lines:
        words = line.split()
        if line.startswith("step ") and "/" in words[1] and int(words[1].split("/")[0]) >= step:
            return True
    return False


def with_argument(arg: str) -> set[int]:
    """Every process whose command line holds `arg` (e.g. a run directory)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if arg.encode() in words:
                found.add(int(entry.name))
    return found


def listening(pids: set[int]) -> list[str]:
    """`address:port` of every TCP socket in LISTEN state owned by `pids` (as `ss -ltnp`
    shows them), read from /proc."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                addr, port = cols[1].split(":")
                found.append(f"{address(addr, width)}:{int(port, 16)}")
    return found


def address(hexaddr: str, width: int) -> str:
    raw = bytes.fromhex(hexaddr)
    if width == 8:
        return ".".join(str(b) for b in raw[::-1])
    words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
    return "[" + b"".join(words).hex() + "]"


def on_loopback(listener: str) -> bool:
    """Whether `address:port` (from `listening`) is on 127.0.0.0/8 or ::1."""
    return listener.startswith(("127.", "[00000000000000000000000000000001]"))
