"""torch's NCCL flight recorder, read for the hang report: each rank's last collective
(sequence number, op, sizes, state) from the dumps torch writes.

With `TORCH_NCCL_TRACE_BUFFER_SIZE=N` (N > 0) every NCCL process group records its last N
collectives; with `TORCH_NCCL_DUMP_ON_TIMEOUT=1` each rank writes them when a collective
times out, to `<prefix><global rank>`, the prefix being `TORCH_FR_DUMP_TEMP_FILE` or
`TORCH_NCCL_DEBUG_INFO_TEMP_FILE` (default `/tmp/nccl_trace_rank_`). A dump is a pickle
of a dict (torch/csrc/distributed/c10d/FlightRecorder.hpp, version "2.x"; read by torch's
own analyser, torch/distributed/flight_recorder/components/loader.py):

    {"version": "2.10", "pg_config": {...}, "pg_status": {...},
     "entries": [{"record_id", "pg_id", "process_group": (name, desc), "collective_seq_id",
                  "p2p_seq_id", "is_p2p", "op_id", "profiling_name" ("nccl:all_reduce"),
                  "time_created_ns", "input_sizes", "input_dtypes", "output_sizes",
                  "output_dtypes", "state" ("scheduled" | "started" | "completed"),
                  "timeout_ms", "frames", ...}, ...]}

A rank can also dump its own recorder in-process (`own_dump`: torch's `_dump_nccl_trace`
in NCCL builds, else `_dump_fr_trace`, which gloo's process groups record to), which
each rank does when the watchdog reports a hang: Phalanx's timeout usually fires before
NCCL's, when no file exists yet. Each rank then also writes its dump, with Python frames,
to `<prefix><rank>` (`write_own_dump`), so torch's analyser can read a gloo hang too
(torch writes none for gloo). (Set `TORCH_FR_BUFFER_SIZE`, or the older
`TORCH_NCCL_TRACE_BUFFER_SIZE`, before the process group is made.)

A dump is read only when it is a regular file of this user's (not a link: a file another
user planted under the shared /tmp prefix is skipped), and only as plain data: the
unpickler refuses any class or function (unpickling one could run code), which torch's
dumps never hold.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from phalanx.paths import atomic_write

DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
TRACKING = ("nccl:", "rccl:", "xccl:")  # backends whose entries move to "completed"
# torch's in-process dumps: NCCL's recorder (NCCL builds only), then the one gloo uses
DUMPERS = ("_dump_nccl_trace", "_dump_fr_trace")


@dataclass(frozen=True)
class LastCollective:
    """The flight-recorder entry a rank is taken to wait in (see `last_collective`)."""
    rank: int
    seq: int  # collective_seq_id (p2p_seq_id for send/recv)
    op: str  # profiling_name without the backend: "all_reduce", "send 0->1"
    state: str  # scheduled (enqueued, not started on the GPU), started, completed
    input_sizes: list
    group: str  # process group "name:desc"
    source: str  # where it was read: a dump file, or "in-process"
    p2p: bool = False  # a send/recv: its seq counts point-to-point ops, not collectives

    def line(self) -> str:
        sizes = ", ".join("x".join(map(str, s)) or "scalar" for s in self.input_sizes)
        return (f"  rank {self.rank}: #{self.seq} {self.op} [{sizes or 'no tensors'}] "
                f"{self.state} (group {self.group}{mesh_dimension(self.group)}; "
                f"{self.source})")


def mesh_dimension(group: str) -> str:
    """", the device mesh's dp_shard dimension" for a DeviceMesh's group (torch describes
    them `mesh_<dimension>`: HSDP's dp_shard ranks all-gather and reduce-scatter, its
    dp_replicate groups all-reduce the gradient shards); "" for any other group."""
    desc = group.split(":", 1)[1] if ":" in group else ""
    return f", the device mesh's {desc[5:]} dimension" if desc.startswith("mesh_") else ""


def prefix_from_env(env: Mapping[str, str] | None = None) -> str:
    found = os.environ if env is None else env
    return next((found[v] for v in PREFIX_VARS if found.get(v)), DEFAULT_PREFIX)


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the flight recorder is on (a trace buffer of at least one entry)."""
    found = os.environ if env is None else env
    raw = found.get("TORCH_FR_BUFFER_SIZE") or found.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    try:
        return int(raw) > 0
    except ValueError:
        return False


def last_collective(dump: dict, rank: int, source: str) -> LastCollective | None:
    """The entry a hung rank waits in: with NCCL (which marks entries completed), its
    oldest unfinished one — every later one queues behind it; else (gloo records every
    entry as scheduled) or when all completed, its newest. None: it recorded nothing."""
    entries = sorted((e for e in dump.get("entries", []) if isinstance(e, dict)), key=_order)
    if not entries:
        return None
    tracked = any(e.get("state") == "completed" for e in entries) or \
        str(entries[-1].get("profiling_name", "")).startswith(TRACKING)
    pending = [e for e in entries if e.get("state") != "completed"]
    entry = pending[0] if tracked and pending else entries[-1]
    name = str(entry.get("profiling_name", "?"))
    op = name.split(":", 1)[1] if ":" in name else name
    seq = entry.get("p2p_seq_id") if entry.get("is_p2p") else entry.get("collective_seq_id")
    pg = entry.get("process_group") or ("?", "undefined")
    group = f"{pg[0]}:{pg[1]}" if len(pg) > 1 and pg[1] != "undefined" else str(pg[0])
    return LastCollective(rank, int(seq if seq is not None else -1), op,
                          str(entry.get("state", "?")), list(entry.get("input_sizes", [])),
                          group, source, bool(entry.get("is_p2p")))


def _order(entry: dict) -> tuple[int, int]:
    return int(entry.get("time_created_ns", 0)), int(entry.get("record_id", 0))


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, strings, numbers): torch's dumps hold
    nothing else, and a pickle naming a class or function — which could run code when
    loaded — is refused."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name}: not plain data (refused)")


def load_plain(data: bytes | IO[bytes]) -> object:
    """A flight recorder dump, read with `_PlainUnpickler`."""
    return _PlainUnpickler(io.BytesIO(data) if isinstance(data, bytes) else data).load()


def _own_file(path: Path) -> IO[bytes] | None:
    """`path` opened for reading when it is a regular file of this user's, not a link
    (a file another user planted under a shared /tmp prefix is not this job's dump)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def read_dumps(world_size: int, prefix: str | None = None,
               since: float = 0.0) -> dict[int, LastCollective]:
    """Rank → its last collective, from the dump files under `prefix` on this machine
    written at or after `since` (a time.time(): an older file is another job's); ranks
    whose file is missing, older or unreadable are left out."""
    prefix = prefix or prefix_from_env()
    found = {}
    for rank in range(world_size):
        path = Path(f"{prefix}{rank}")
        fh = _own_file(path)
        if fh is None:
            continue
        try:
            with fh:
                # (2 s of slack: a file's time comes from a coarser clock than time.time())
                if os.fstat(fh.fileno()).st_mtime < since - 2.0:
                    continue
                dump = load_plain(fh)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ValueError,
                IndexError, KeyError):
            continue
        if isinstance(dump, dict):
            last = last_collective(dump, rank, str(path))
            if last is not None:
                found[rank] = last
    return found


def own_dump(stacks: bool = False) -> dict | None:
    """This rank's flight recorder, dumped in-process: NCCL's, else the one gloo records
    to — the first dumper with entries (None: the recorder is off, or nothing was
    recorded); `stacks`: each entry with its Python frames. Never raises: a hang report
    must not."""
    if not enabled():
        return None
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return None
    for name in DUMPERS:
        try:
            dump = load_plain(getattr(c10d, name)(True, stacks, False))
        except Exception:  # not in this build, or the dump failed
            continue
        if isinstance(dump, dict) and dump.get("entries"):
            return dump
    return None


def write_own_dump(rank: int, dump: dict) -> Path | None:
    """At a hang report: this rank's recorder (`dump`: `own_dump(stacks=True)`) in
    `<prefix><rank>` — the file NCCL's own timeout would write, which torch never writes
    for gloo (its groups' table named as its entries name them, `_named_groups`) — so
    torch's analyser reads the same dumps as Phalanx (`python -m
    torch.distributed.flight_recorder.fr_trace DIR -p NAME`). Replaced atomically (a link
    there is replaced, not followed); None when the write failed. Never raises."""
    path = Path(prefix_from_env() + str(rank))
    try:
        return atomic_write(path, pickle.dumps(_named_groups(dump)), mode=0o600)
    except (OSError, pickle.PickleError, TypeError, AttributeError):
        return None


def _named_groups(dump: dict) -> dict:
    """The dump with its groups' table under the names its entries use: torch 2.13's gloo
    recorder lists the default group as '' while its entries call it '0', and torch's
    analyser then stops on a KeyError. Nothing else is changed."""
    config = dump.get("pg_config")
    used = {e["process_group"][0] for e in dump.get("entries", [])
            if isinstance(e.get("process_group"), (tuple, list))}
    if isinstance(config, dict) and "" in config and len(used - set(config)) == 1:
        name = (used - set(config)).pop()
        config[name] = {**config.pop(""), "name": name}
    return dump


def own_last(rank: int) -> dict | None:
    """This rank's last collective as a JSON-able dict (for its stack answer), or None."""
    dump = own_dump()
    last = None if dump is None else last_collective(dump, rank, "in-process")
    return None if last is None else last.__dict__


def section(world_size: int, answers: dict[int, dict | None] | None = None,
            prefix: str | None = None, since: float = 0.0,
            dumped: list[int] | None = None) -> list[str]:
    """The hang report's lines: each rank's last collective, from its in-process answer
    (`answers`: rank → `own_last`'s dict) or else a dump file written since `since`;
    [] when there is neither. `dumped`: the ranks that wrote their dump for torch's
    analyser (`write_own_dump`), named with where it lies."""
    found = read_dumps(world_size, prefix, since) if enabled() or prefix else {}
    for rank, raw in (answers or {}).items():
        try:
            found[rank] = LastCollective(**raw) if raw else found[rank]
        except (TypeError, KeyError):  # no answer, or one of another shape: the file's
            pass
    if not found:
        return []
    lines = ["torch's flight recorder (the collective each rank waits in):"]
    lines += [found[r].line() for r in sorted(found)]
    missing = [r for r in range(world_size) if r not in found]
    if missing:
        lines.append(f"  no record from rank(s) {', '.join(map(str, missing))} (no dump "
                     f"file on this machine, and no in-process answer)")
    behind = _behind(found)
    if behind:
        lines.append(behind)
    if dumped:
        lines.append(_dumps_line(world_size, dumped))
    return lines


def _dumps_line(world_size: int, dumped: list[int]) -> str:
    """Where the ranks that wrote their dump put it (each on its own machine), and the
    command that analyses them; the ranks that wrote none."""
    where = Path(prefix_from_env())
    ranks = "each rank's" if len(dumped) == world_size else \
        f"rank(s) {', '.join(map(str, dumped))}'s (the others wrote none)"
    return (f"  {ranks} dump: {where}<rank>; torch's analyser: python -m "
            f"torch.distributed.flight_recorder.fr_trace {where.parent} -p "
            f"{where.name} --print_stack_trace")


def _behind(found: dict[int, LastCollective]) -> str | None:
    """Within one process group, the ranks whose last collective is older than the one
    the others wait in: they never entered it."""
    found = {r: c for r, c in found.items() if not c.p2p}  # one numbering: collectives'
    if len({c.group for c in found.values()}) != 1:
        return None
    waiting = [c.seq for c in found.values() if c.state != "completed"]
    if not waiting:
        return None
    target = max(waiting)
    late = sorted(r for r, c in found.items() if c.seq < target)
    if not late:
        return None
    where = "; ".join(f"rank {r} is at #{found[r].seq} ({found[r].state})" for r in late)
    return (f"  the others wait in #{target}; {where}: they never entered collective "
            f"#{target}.")
