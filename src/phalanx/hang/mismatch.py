"""Plain words for torch's collective-mismatch error (TORCH_DISTRIBUTED_DEBUG=DETAIL).

torch's message is one long line of `CollectiveFingerPrint(...)` reprs; this names the
ranks, the operations, shapes and dtypes, what differs, and where the call was made.
"""

from __future__ import annotations

import re
import traceback

from phalanx.errors import DistributedError
from phalanx.hang.stacks import Frame, is_user, short

_PRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\("
                    r"SequenceNumber=(\d+), OpType=(\w+), TensorShape=\[([^\]]*)\], "
                    r"TensorDtypes=(\w+)")
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Bool": "bool", "Byte": "uint8"}


def _side(match: re.Match) -> dict:
    rank, seq, op, shape, dtype = match.groups()
    return {"rank": int(rank), "seq": int(seq), "op": op.lower(),
            "shape": "[" + shape.replace(" ", "") + "]", "dtype": _DTYPES.get(dtype, dtype)}


def explain(exc: BaseException) -> DistributedError | None:
    """A `DistributedError` for a collective mismatch, or None for any other error."""
    found = list(_PRINT.finditer(str(exc)))
    if len(found) < 2:
        return None
    a, b = _side(found[0]), _side(found[1])
    differs = [what for what, key in (("operations", "op"), ("shapes", "shape"),
                                       ("dtypes", "dtype")) if a[key] != b[key]]
    site = _user_site(exc)
    where = f" at {short(site.file)}:{site.line} (`{site.code}`)" if site else ""
    return DistributedError(
        f"collective mismatch at collective #{a['seq']}: rank {a['rank']} runs {a['op']} of "
        f"{a['dtype']}{a['shape']}{where}, but rank {b['rank']} runs {b['op']} of "
        f"{b['dtype']}{b['shape']} — the {' and '.join(differs) or 'arguments'} differ. Every "
        f"rank must call the same collectives in the same order with the same shapes and "
        f"dtypes.", [a["rank"]])


# errors a rank gets because another one died: they describe the effect, not the cause
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
             "remote worker", "connectFullMesh")


def peer_lost(exc: BaseException, rank: int, peers=None) -> DistributedError | None:
    """One line for a collective that failed because another rank went away (its own
    error is the cause, reported by the launcher), or None for any other error. `peers`
    (phalanx.cluster.peers.Peers) names the rank and its host from gloo's peer address."""
    text = str(exc)
    marker = next((m for m in PEER_LOST if m in text), None)
    if marker is None or not isinstance(exc, RuntimeError):
        return None
    site = _user_site(exc)
    where = f" at {short(site.file)}:{site.line}" if site else ""
    who = (peers.lost(text, rank) if peers is not None else None) or "another rank"
    return DistributedError(f"lost the connection to {who} in a collective{where} "
                            f"({marker}): that rank failed or was stopped; its own error is "
                            f"the cause.", [rank])


def _user_site(exc: BaseException) -> Frame | None:
    frames = [Frame(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
              for f in traceback.extract_tb(exc.__traceback__)]
    user = [f for f in frames if is_user(f)]
    return user[-1] if user else None
