"""Collectives checked by value, an all_reduce bandwidth sweep, and per-rank compute speed."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from phalanx.doctor.checks import Check

SWEEP_BYTES = [2 ** k for k in range(12, 25, 2)]  # 4 KiB … 16 MiB
STRAGGLER, STRAGGLER_FAIL = 1.5, 3.0  # slowest / fastest rank's compute time
ROUNDS = 3  # measurements of it at most, while a rank looks like a straggler


def _value_check(name: str, run_it) -> Check:
    """`run_it()` → (ok, evidence); an exception is a failure with its first line."""
    try:
        ok, evidence = run_it()
    except RuntimeError as exc:
        first = str(exc).splitlines()[0][:200]
        if "not supported" in first.lower() or "unsupported" in first.lower():
            return Check("collectives", name, "warn", f"not supported here: {first}")
        return Check("collectives", name, "fail", first, "see `phalanx doctor` network advice")
    return Check("collectives", name, "pass" if ok else "fail", evidence,
                 "" if ok else "a wrong result from a collective: a broken backend/network, "
                               "or ranks of different jobs in one group")


def collective_checks(device: torch.device, world: int, rank: int) -> list[Check]:
    def all_reduce():
        t = torch.full((1000,), float(rank + 1), device=device)
        dist.all_reduce(t)
        want = world * (world + 1) / 2
        return bool((t == want).all()), f"sum of rank+1 over {world} ranks = {t[0].item():g} " \
                                        f"(expected {want:g})"

    def broadcast():
        t = torch.arange(1000, dtype=torch.float32, device=device) if rank == 0 else \
            torch.zeros(1000, device=device)
        dist.broadcast(t, 0)
        return bool((t == torch.arange(1000, device=device)).all()), "rank 0's arange(1000) " \
                                                                      "arrived on every rank"

    def all_gather():
        out = [torch.empty(4, device=device) for _ in range(world)]
        dist.all_gather(out, torch.full((4,), float(rank), device=device))
        got = [int(o[0].item()) for o in out]
        return got == list(range(world)), f"gathered ranks {got}"

    def reduce_scatter():
        chunks = [torch.full((4,), float(rank + i), device=device) for i in range(world)]
        out = torch.empty(4, device=device)
        dist.reduce_scatter(out, chunks)
        want = sum(r + rank for r in range(world))
        return bool((out == want).all()), f"chunk {rank}: {out[0].item():g} (expected {want})"

    def barrier():
        t0 = time.perf_counter()
        dist.barrier()
        return True, f"{(time.perf_counter() - t0) * 1e3:.1f} ms"

    checks = [_value_check(n, f) for n, f in (("all_reduce", all_reduce), ("broadcast", broadcast),
                                              ("all_gather", all_gather),
                                              ("reduce_scatter", reduce_scatter),
                                              ("barrier", barrier))]
    return agree(checks)


def agree(local: list[Check]) -> list[Check]:
    """Every rank's results for the same checks: the worst status wins, naming the rank."""
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    merged = []
    for i in range(len(local)):
        worst = max(((r, g[i]) for r, g in enumerate(gathered)),
                    key=lambda rg: ("pass", "warn", "fail").index(rg[1].status))
        r, c = worst
        if c.status != "pass":
            c.evidence = f"rank {r}: {c.evidence}"
        merged.append(c)
    return merged


def bandwidth_sweep(device: torch.device, world: int, repeats: int = 5) -> list[dict]:
    rows = []
    for nbytes in SWEEP_BYTES:
        t = torch.ones(nbytes // 4, device=device)
        for _ in range(2):
            dist.all_reduce(t)
        times = []
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            dist.all_reduce(t)
            _sync(device)
            times.append(time.perf_counter() - t0)
        seconds = statistics.median(times)
        slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the collective ends on the slowest
        algbw = nbytes / slowest.item() / 1e9
        rows.append({"bytes": nbytes, "ms": slowest.item() * 1e3, "algbw_gbs": algbw,
                     "busbw_gbs": algbw * 2 * (world - 1) / world})
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compute_check(device: torch.device, world: int) -> Check:
    """The same matmul work on every rank, timed: each rank's best of many short runs
    (a run that other work on the machine interrupted is not the best), slowest / fastest
    names a straggler. A ratio at or over the threshold is measured again, up to
    `ROUNDS` times, each rank keeping its best: a busy moment passes, a straggler stays."""
    a = torch.randn(256, 256, device=device)
    best = torch.tensor(float("inf"), dtype=torch.float64, device=device)
    rounds, secs = 0, [0.0]
    while rounds < ROUNDS and (rounds == 0 or max(secs) / min(secs) >= STRAGGLER):
        best = torch.minimum(best, torch.tensor(_best_of(a, device), dtype=torch.float64,
                                                device=device))
        every = [torch.empty_like(best) for _ in range(world)]
        dist.all_gather(every, best)
        secs = [e.item() for e in every]  # the same on every rank: the same decision
        rounds += 1
    return straggler_check(secs, rounds)


def _best_of(a: torch.Tensor, device: torch.device, reps: int = 30) -> float:
    """The best time of `reps` runs of 5 matmuls (short: one that nothing interrupts is
    likely even on a busy machine)."""
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(5):
            a = torch.tanh(a @ a)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def straggler_check(secs: list[float], rounds: int = 1) -> Check:
    """Each rank's best time for the same work (over `rounds` measurements): a rank
    `STRAGGLER`× the fastest or slower warns, `STRAGGLER_FAIL`× fails; the thresholds are
    in the evidence. (A machine busy with other work spreads ranks by 1.15–1.22×: a
    pass.)"""
    ratio = max(secs) / min(secs)
    slow = secs.index(max(secs))
    status = "pass" if ratio < STRAGGLER else "warn" if ratio < STRAGGLER_FAIL else "fail"
    again = f", best of {rounds} rounds" if rounds > 1 else ""
    return Check("performance", "compute speed per rank", status,
                 f"slowest/fastest = {ratio:.2f} (rank {slow} slowest; "
                 f"{', '.join(f'{s * 1e3:.2f}' for s in secs)} ms{again}; a straggler at "
                 f"≥ {STRAGGLER:g}×, fails at ≥ {STRAGGLER_FAIL:g}×)",
                 "" if status == "pass" else f"rank {slow} is a straggler: check its threads "
                 f"(--threads-per-rank), clocks, or other jobs on its cores/GPU")
