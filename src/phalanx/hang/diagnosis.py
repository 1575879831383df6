"""One report for a hung job: where each rank is, which ranks are missing from the
collective the others wait in, and the most likely cause."""

from __future__ import annotations

from phalanx.hang.stacks import Activity, Frame, describe, is_user, short
from phalanx.hang.static import static_citation
from phalanx.hang.uneven import find_uneven, finished_cause, uneven_cause

FIX_RANK_ONLY = ("Run the collective on every rank and keep only the printing/saving "
                 "under the rank condition (see `phalanx lint`, PX301).")


def build_report(stacks: dict[int, list[Frame] | None], beats: dict[int, dict],
                 timeout: float, world_size: int,
                 wrappers: dict[int, frozenset[str]] | None = None,
                 finished: dict[int, dict] | None = None,
                 flight: list[str] | None = None, parted: str | None = None
                 ) -> tuple[str, str]:
    """(the full report, a one-line summary) from every rank's main-thread stack;
    `wrappers`: each rank's live torch wrappers (see stacks.live_wrappers); `finished`:
    the ranks whose script returned, with their counts (Watchdog.finished_ranks);
    `flight`: the NCCL flight recorder's lines (flight_recorder.section), if any;
    `parted`: where the flight recorder's entries show the ranks parted (hang.parting)."""
    wrappers, finished = wrappers or {}, finished or {}
    acts = {r: describe(s, wrappers.get(r)) for r, s in stacks.items() if s is not None}
    silent = sorted(r for r, s in stacks.items() if s is None)
    lines = [f"phalanx: the job is hung: no rank made progress for {timeout:g} s "
             f"({world_size} ranks).", ""]
    for r in range(world_size):
        line = _rank_line(r, acts.get(r), beats.get(r))
        lines.append(line if r not in finished or r in acts else
                     f"  rank {r}: finished the script (it has exited)")
    cause = likely_cause(acts, silent, world_size, beats, finished)
    if not any(a.condition and a.collective for a in acts.values()):  # where they parted
        cited = static_citation(s for s in stacks.values() if s is not None)
        cause = f"{cause} {cited}" if cited else cause
    if parted:  # (the recorder's: the collective where the ranks' lines first differ)
        cause = f"{cause} From the flight recorder: {parted}"
    lines += ["", f"Most likely cause: {cause}"]
    if flight:
        lines += ["", *flight]
    lines += ["", "Stacks (user code, outermost first):"]
    for r in sorted(acts):
        user = [f for f in stacks[r] or [] if is_user(f)]
        lines.append(f"  rank {r}:")
        lines += [f"    {short(f.file)}:{f.line} in {f.function}: {f.code}" for f in user] or \
            ["    (no user frames)"]
    return "\n".join(lines), cause


def _rank_line(rank: int, act: Activity | None, beat: dict | None) -> str:
    hb = ""
    if beat is not None:
        step = f"step {beat['step']}, " if beat.get("step", -1) >= 0 else ""
        phase = f"{beat['phase']}, " if beat.get("phase", "start") != "start" else ""
        hb = f" [{step}{phase}idle {beat['idle']:.0f} s, pid {beat['pid']} on {beat['host']}]"
    if act is None:
        return f"  rank {rank}: did not answer (dead, or stuck in C code holding the GIL){hb}"
    what = f"in {act.collective} at {act.where()}" if act.collective else \
        f"not in a collective: at {act.where()}"
    return f"  rank {rank}: {what}{act.context()}{hb}"


def likely_cause(acts: dict[int, Activity], silent: list[int], world_size: int,
                 beats: dict[int, dict] | None = None,
                 finished: dict[int, dict] | None = None) -> str:
    finished = finished or {}
    if silent and set(silent) <= set(finished):
        done = {r: finished[r] for r in silent}
        cause = finished_cause(done, acts, beats or {})
        if cause:
            return cause
    if silent:
        return (f"rank(s) {', '.join(map(str, silent))} did not answer: a process that died "
                f"or is stuck outside Python; the others wait for it.")
    groups: dict[tuple, list[int]] = {}
    for r, act in sorted(acts.items()):
        groups.setdefault((act.collective, act.where()), []).append(r)
    if len(groups) == 1:
        (coll, where), ranks = next(iter(groups.items()))
        if coll is None:
            return f"no rank is in a collective (all at {where}): the job is stuck outside " \
                   f"torch.distributed (data loading, I/O, a lock)."
        return (f"every rank is in {coll} at {where} and it does not complete: a rank of "
                f"another job/group, or the network (check `phalanx doctor`).")
    p2p = _pipeline_cause(acts, world_size) or _p2p_cause(acts, world_size)
    if p2p:
        return p2p
    conditioned = [(r, a) for r, a in sorted(acts.items()) if a.condition and a.collective]
    if conditioned:
        r, act = conditioned[0]
        same = groups[(act.collective, act.where())]
        others = [q for q in range(world_size) if q not in same]
        elsewhere = "; ".join(f"rank {q} is {_where(acts[q])}" for q in others)
        return (f"rank(s) {', '.join(map(str, same))} are in {act.collective} at "
                f"{act.where()}{act.called_from()}, reached only under {act.condition}; "
                f"{elsewhere} — they never join it. {FIX_RANK_ONLY}")
    uneven = find_uneven(acts)
    if uneven is not None:
        return uneven_cause(uneven, acts, beats or {})
    parts = "; ".join(f"rank(s) {', '.join(map(str, ranks))} {_where(acts[ranks[0]])}"
                      for ranks in groups.values())
    return (f"the ranks are in different places: {parts}. Every rank must call the same "
            f"collectives in the same order.")


def _p2p_cause(acts: dict[int, Activity], world_size: int) -> str | None:
    """A rank waiting in a point-to-point send/recv whose peer is elsewhere: it is not a
    collective every rank must call, but one the peer must answer."""
    waiting = [r for r, a in sorted(acts.items()) if a.collective in ("send", "recv")]
    if not waiting:
        return None
    act = acts[waiting[0]]
    others = "; ".join(f"rank {q} is {_where(acts[q])}" for q in range(world_size)
                       if q in acts and q not in waiting)
    return (f"rank(s) {', '.join(map(str, waiting))} wait in {act.collective} at "
            f"{act.where()}{act.called_from()} for a peer that never matches it"
            f"{'; ' + others if others else ''}. Every recv needs a send on its source rank "
            f"(and every send a recv on its destination), reached on both sides.")


def _pipeline_cause(acts: dict[int, Activity], world_size: int) -> str | None:
    """A rank waiting in a pipeline schedule's send/recv while a neighbouring stage is
    elsewhere: the stages did not run the schedule's step together (most often: a stage
    had fewer batches, and left the loop)."""
    waiting = [r for r, a in sorted(acts.items())
               if a.collective and a.collective.startswith("the pipeline schedule")]
    if not waiting:
        return None
    act = acts[waiting[0]]
    others = "; ".join(f"rank {q} is {_where(acts[q])}" for q in range(world_size)
                       if q in acts and q not in waiting)
    uneven = find_uneven(acts)
    left = "" if uneven is None else (
        f" — rank(s) {', '.join(map(str, uneven.ahead))} left the loop at "
        f"{short(uneven.loop.file)}:{uneven.loop.line}, so the stages ran the schedule a "
        f"different number of times")
    return (f"rank(s) {', '.join(map(str, waiting))} are in {act.collective} at "
            f"{act.where()}{act.called_from()}, and the stage it waits for never answers"
            f"{'; ' + others if others else ''}{left}. Every stage of a pipeline must run "
            f"the schedule's step for the same batches, the same number of times (the ranks "
            f"of one pipeline share a data-parallel rank: `run.loader` gives them the same "
            f"batches).")


def _where(act: Activity) -> str:
    return f"in {act.collective} at {act.where()}" if act.collective else \
        f"outside any collective at {act.where()}"
