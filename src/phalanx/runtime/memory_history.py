"""CUDA memory history for out-of-memory errors: `--memory-history N` (the trainer) or
`phalanx.init(memory_history=N)` has torch record the last N allocator events
(`torch.cuda.memory._record_memory_history`) from the start — a snapshot only shows what
was recorded before the error. A `torch.OutOfMemoryError` that then leaves the script or
the trainer writes `memory-snapshot-rank-R.pickle` into the run directory and becomes one
line naming the file and how to view it (https://pytorch.org/memory_viz: drag the file
onto the page). Without the history, the line says how to turn it on.

CPU ranks have no allocator history: there an out-of-memory is usually the kernel's OOM
killer (SIGKILL), which the launcher names (launch.failures). Not run on a GPU yet."""

from __future__ import annotations

from pathlib import Path

import torch

from phalanx.errors import DistributedError, UserError

VIEWER = "https://pytorch.org/memory_viz"


def check_entries(entries: int) -> int:
    if not isinstance(entries, int) or isinstance(entries, bool) or entries < 0:
        raise UserError(f"memory_history={entries!r}: give the number of allocator events to "
                        f"keep (e.g. 100000), or 0 for none.")
    return entries


def start(device: torch.device, entries: int) -> int:
    """Record the last `entries` allocator events on a CUDA device; the entries recorded
    (0: none — off, or not CUDA)."""
    if entries <= 0 or device.type != "cuda":
        return 0
    torch.cuda.memory._record_memory_history(max_entries=entries)
    return entries


def explain_oom(exc: BaseException | None, rank: int, recorded: int,
                out: Path | None) -> DistributedError | None:
    """The one-line error for a CUDA out-of-memory (the snapshot written when recorded),
    or None when `exc` is not one."""
    if not isinstance(exc, torch.OutOfMemoryError):
        return None
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
    if not recorded:
        return DistributedError(
            f"{first[:300]} — to see what held the memory, run again with "
            f"`--memory-history 100000` (phalanx.init(memory_history=100000)): the next "
            f"out-of-memory writes a snapshot to view at {VIEWER}.", [rank])
    path = Path(out or ".") / f"memory-snapshot-rank-{rank}.pickle"
    try:
        torch.cuda.memory._dump_snapshot(str(path))
    except Exception as dump_error:  # noqa: BLE001 - the OOM is the error to report
        return DistributedError(f"{first[:300]} (the memory snapshot could "
                                f"not be written to {path}: {dump_error}).", [rank])
    return DistributedError(
        f"{first[:300]} — the last {recorded} allocator events are in "
        f"{path}: drag it onto {VIEWER} to see what held the memory.", [rank])


def plain_failure(exc: BaseException | None, run) -> Exception | None:
    """The error that left a rank's script, in plain words when Phalanx can say it: a
    collective mismatch, a lost peer, a CUDA out-of-memory (with its snapshot); None
    otherwise (the exception is reported as it is)."""
    from phalanx.hang.mismatch import explain, peer_lost

    if not isinstance(exc, Exception):
        return None
    return explain(exc) or peer_lost(exc, run.rank, run.topology.peers) or explain_oom(
        exc, run.rank, run.memory_history, run.out)
