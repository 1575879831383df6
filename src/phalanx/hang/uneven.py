"""Uneven inputs: one rank has left the training loop (it waits in a barrier, a collective
after the loop, or is ending) while another is still in a step's collective — the ranks
ran a different number of iterations, because their data shards differ in length.

Read from the user frames of two ranks' stacks and the loops (`for`/`while`) of the
source file, with the iteration counts the heartbeats carry when known.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache

from phalanx.hang.stacks import Activity, Frame, short

FIX_UNEVEN = ("Give every rank the same number of batches: a DistributedSampler (it pads "
              "the shards to equal length by default), `drop_last=True` where a split is "
              "uneven, or `run.loader`; with DDP, torch's `torch.distributed.algorithms.Join"
              "([model])` context manager lets the ranks that finish early shadow the rest.")


@dataclass
class Uneven:
    ahead: list[int]  # the ranks past the loop
    behind: list[int]  # the ranks still in it (they ran more iterations)
    loop: Frame  # the loop's `for`/`while` line


@lru_cache(maxsize=64)
def _loops(path: str) -> tuple[tuple[int, int], ...]:
    """(first line, last line) of every `for`/`while` loop in the file."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple((n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
                 if isinstance(n, (ast.For, ast.AsyncFor, ast.While)))


def _outermost_loop_left(path: str, inside: int, past: int) -> tuple[int, int] | None:
    """The outermost loop of `path` around line `inside` that line `past` comes after."""
    left = [(a, b) for a, b in _loops(path) if a <= inside <= b and past > b]
    return min(left) if left else None


def loop_left(ahead: list[Frame], behind: list[Frame]) -> Frame | None:
    """The loop (its first line) that `behind`'s user frames are still in and `ahead`'s
    have left, or None (the stacks are not that)."""
    for i, (a, b) in enumerate(zip(ahead, behind)):
        if (a.file, a.function) != (b.file, b.function):
            return None
        if a.line == b.line:
            continue
        if a.line < b.line:
            return None
        loop = _outermost_loop_left(a.file, b.line, a.line)
        if loop is not None:
            return Frame(a.file, loop[0], a.function)
        # `ahead` returned from the call `behind` is still in: a loop deeper in it
        for deeper in behind[i + 1:]:
            inner = next(((x, y) for x, y in _loops(deeper.file) if x <= deeper.line <= y),
                         None)
            if inner is not None:
                return Frame(deeper.file, inner[0], deeper.function)
        return None
    return None


def find_uneven(acts: dict[int, Activity]) -> Uneven | None:
    """Two groups of ranks: some in a collective inside a loop, the others past it."""
    places: dict[tuple, list[int]] = {}
    for r, act in sorted(acts.items()):
        places.setdefault(tuple(act.user), []).append(r)
    if len(places) != 2:
        return None
    (x, xs), (y, ys) = places.items()
    for ahead, behind, ranks in ((x, y, (xs, ys)), (y, x, (ys, xs))):
        if acts[ranks[1][0]].collective and ahead and behind:
            loop = loop_left(list(ahead), list(behind))
            if loop is not None:
                return Uneven(ranks[0], ranks[1], loop)
    return None


def counts(beats: dict[int, dict], ahead: list[int], behind: list[int]) -> str:
    """The ranks' iteration counts, from what their heartbeats carry: the steps a Run
    reports (phalanx.init), else the torch optimizer steps the watchdog counted."""
    ranks = sorted(ahead + behind)
    if all(beats.get(r, {}).get("step", -1) >= 0 for r in ranks):
        return "last step reported: " + ", ".join(f"rank {r}: {beats[r]['step']}"
                                                  for r in ranks)
    steps = {r: beats.get(r, {}).get("optimizer_steps", 0) for r in ranks}
    if all(steps.values()):
        done = ", ".join(f"rank {r}: {steps[r]}" for r in ranks)
        nth = max(steps[r] for r in behind) + 1
        return (f"optimizer steps taken: {done}; {_ranks(behind)} "
                f"{'is' if len(behind) == 1 else 'are'} in iteration {nth}")
    return ("the iteration counts are not known: the script reports no steps (phalanx.init's "
            "Run does) and steps no torch optimizer")


def uneven_cause(u: Uneven, acts: dict[int, Activity], beats: dict[int, dict]) -> str:
    """The cause line: who left the loop, who is still in which collective, the counts and
    the fix."""
    behind, ahead = acts[u.behind[0]], acts[u.ahead[0]]
    b_ranks, a_ranks = _ranks(u.behind), _ranks(u.ahead)
    past = f"in {ahead.collective}" if ahead.collective else "outside any collective"
    return (f"uneven inputs: {a_ranks} left the loop at {short(u.loop.file)}:{u.loop.line} "
            f"and {_be(u.ahead)} {past} at {ahead.where()}, while {b_ranks} {_be(u.behind)} "
            f"still in it, in {behind.collective} at {behind.where()} — the ranks ran a "
            f"different number of iterations and {b_ranks} ran more "
            f"({counts(beats, u.ahead, u.behind)}). {FIX_UNEVEN}")


def _be(ranks: list[int]) -> str:
    return "is" if len(ranks) == 1 else "are"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def finished_cause(done: dict[int, dict], acts: dict[int, Activity],
                   beats: dict[int, dict]) -> str | None:
    """The cause when the ranks that stopped answering had finished the script while the
    others wait in a collective (NCCL waits for a peer that left; gloo fails at once, see
    `ended_early`); None when that is not the case."""
    waiting = [r for r, act in sorted(acts.items()) if act.collective]
    if not done or not waiting or len(waiting) != len(acts):
        return None
    act = acts[waiting[0]]
    merged = {**beats, **done}
    return (f"{_ranks(sorted(done))} finished the script while {_ranks(waiting)} "
            f"{_be(waiting)} still in {act.collective} at {act.where()}: the ranks ran a "
            f"different number of collectives — most likely uneven inputs: "
            f"{_ranks(waiting)} ran more iterations ({counts(merged, sorted(done), waiting)})."
            f" {FIX_UNEVEN}")


def ended_early(exc: BaseException, rank: int, done: dict[int, dict], beat) -> Exception:
    """The error for a rank whose collective failed because its peers' scripts had
    returned (gloo: "Connection closed by peer"): uneven inputs, in plain words."""
    import traceback

    from phalanx.errors import DistributedError
    from phalanx.hang.stacks import describe, live_wrappers

    frames = [Frame(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
              for f in traceback.extract_tb(exc.__traceback__)]
    act = describe(frames, frozenset(live_wrappers()))
    beats = {**done, rank: {"step": beat.step, "optimizer_steps": beat.optimizer_steps}}
    return DistributedError(  # the diagnosis first: the launcher shows 300 characters
        f"uneven inputs: {_ranks(sorted(done))} finished the script while rank {rank} was "
        f"still in {act.collective or 'a collective'} at {act.where()} — rank {rank} ran "
        f"more iterations ({counts(beats, sorted(done), [rank])}). {FIX_UNEVEN}", [rank])
