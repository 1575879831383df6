"""Where the ranks parted: the first collective, by sequence number within its process
group, whose op, sizes, dtypes or user-code line differ between ranks — read from each
rank's flight-recorder entries (with their Python frames), which every rank sends with
its stack at a hang report when the recorder is on (`TORCH_FR_BUFFER_SIZE`).

This finds what the stacks at the moment of the hang cannot: a rank-0-only evaluation
under FSDP issues all-gathers that match the training ones in op and size, and by the
time the watchdog looks the other rank has moved on to the next step — but the entry's
line (the evaluation's forward, under `if rank == 0:`) differs from the other rank's
entry of the same number (the training forward).
"""

from __future__ import annotations

from typing import Any

from phalanx.hang.stacks import Frame, describe, is_user

HISTORY = 64  # each rank's newest entries sent (a small JSON answer)


def history(dump: dict | None, limit: int = HISTORY) -> list[dict[str, Any]] | None:
    """A rank's newest collectives (not point-to-point) from its recorder's dump (with
    stacks), each with its user frames (outermost first); None without one. Never raises."""
    try:
        if dump is None:
            return None
        return [_entry(e) for e in dump["entries"][-limit:] if not e.get("is_p2p")]
    except Exception:  # noqa: BLE001 - a hang report must not fail on its extras
        return None


def _entry(e: dict) -> dict[str, Any]:
    frames = [Frame(str(f.get("filename", "")), int(f.get("line", 0)), str(f.get("name", "")))
              for f in reversed(e.get("frames") or [])]  # (torch lists them innermost first)
    return {"group": str(e["process_group"][0]), "seq": int(e["collective_seq_id"]),
            "op": str(e.get("profiling_name", "")).split(":")[-1],
            "sizes": e.get("input_sizes"), "dtypes": e.get("input_dtypes"),
            "user": [[f.file, f.line, f.function] for f in frames if is_user(f)]}


def parted(histories: dict[int, list[dict] | None]) -> str | None:
    """`the ranks parted at collective #7 of group 0: rank 0 ran all_gather at ...; rank 1
    ran all_gather at ...` — the earliest collective every reporting member recorded whose
    op, sizes, dtypes or innermost user line differ between them; None when none differ
    (or fewer than two ranks sent entries)."""
    by_number: dict[tuple[str, int], dict[int, dict]] = {}
    for rank, entries in histories.items():
        for e in entries or []:
            by_number.setdefault((e["group"], e["seq"]), {})[rank] = e
    for (group, seq), found in sorted(by_number.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if len(found) < 2:
            continue
        kinds: dict[tuple, list[int]] = {}
        for rank, e in sorted(found.items()):
            kinds.setdefault(_signature(e), []).append(rank)
        if len(kinds) > 1:
            said = "; ".join(_ran(ranks, found[ranks[0]]) for ranks in kinds.values())
            return f"the ranks parted at collective #{seq} of group {group}: {said}."
    return None


def _signature(e: dict) -> tuple:
    line = tuple(e["user"][-1][:2]) if e["user"] else None
    return e["op"], repr(e["sizes"]), repr(e["dtypes"]), line


def _ran(ranks: list[int], e: dict) -> str:
    """`rank(s) 0 ran all_gather [4] at case.py:17 in <module>(), under `if ...` at ...`."""
    sizes = ", ".join("×".join(map(str, s)) for s in e["sizes"] or []) or "no tensors"
    what = f"rank(s) {', '.join(map(str, ranks))} ran {e['op']} [{sizes}]"
    if not e["user"]:
        return f"{what} outside user code"
    act = describe([Frame(f, int(n), fn) for f, n, fn in e["user"]])
    under = f", under {act.condition}" if act.condition else ""
    return f"{what} at {act.where()}{under}"
