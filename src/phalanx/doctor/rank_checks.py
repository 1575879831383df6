"""One rank of `phalanx doctor`: the rendezvous and reachability checked before the
process group is made (a failure there would hang its creation, and torch's timeout
names nobody), then the checks in a live group; rank 0 prints the table and, under
Phalanx's launcher, hands the verdict to it in a file."""

from __future__ import annotations

import os
import time

from phalanx.cluster import protocol
from phalanx.cluster.env import global_rank, has_ranks, launched_world, local_rank
from phalanx.doctor import checks as report
from phalanx.errors import DistributedError
from phalanx.paths import atomic_write
from phalanx.strategies import spec


def worker(*, model: str | None, strategy: str, init_timeout_s: float, as_json: bool) -> int:
    """One rank: the checks in order (rendezvous, reachability, then in the process group
    versions, launch, collectives, bandwidth, compute, network advice and `model`, wrapped
    by `strategy`); rank 0 prints the table (`as_json`: JSON). Exit code: `_verdict`."""
    # imported in the ranks, never in the launching process (`phalanx --help` loads this)
    from phalanx.doctor.comms import agree, bandwidth_sweep, collective_checks, compute_check
    from phalanx.doctor.environment import launch_checks, local_facts, network_advice, versions
    from phalanx.doctor.model import model_checks
    from phalanx.hang.watchdog import job_store
    from phalanx.runtime.init import init

    t0 = time.perf_counter()
    if _world() > 1:
        store = job_store(_world(), "doctor")
        wait_for_peers(store, _rank(), _world(), init_timeout_s)
        unreachable, machines = reachability(store, init_timeout_s)
        if unreachable:
            return _report_unreachable(unreachable, as_json)
    run = init(0, timeout_s=init_timeout_s, strategy=strategy,
               **_torch_defaults(strategy)) if _world() > 1 else init(0)
    found = [report.Check("rendezvous", "process group init", "pass",
                          f"{run.world_size} rank(s) joined, {run.backend}, "
                          f"{time.perf_counter() - t0:.2f} s")]
    if _world() > 1:
        found.append(report.Check("network", "machines reach each other", "pass",
                                  f"{machines} machine(s): each connected to the others "
                                  f"where the collectives listen"))
    with run:
        facts = run.gather_objects(local_facts())
        found += versions(run.backend) + launch_checks(facts)
        found += collective_checks(run.device, run.world_size, run.rank)
        bandwidth = bandwidth_sweep(run.device, run.world_size) if run.world_size > 1 else []
        found.append(compute_check(run.device, run.world_size))
        found += network_advice(facts, run.backend)
        found += agree(model_checks(run, model))  # the worst rank's result, named
        failed = run.broadcast(any(c.status == "fail" for c in found))  # rank 0's verdict
        if run.is_main:
            out = report.as_json(found, bandwidth) if as_json else \
                report.render_table(found, bandwidth)
            print(out, flush=True)
    return _verdict(failed)


def _verdict(failed: bool) -> int:
    """The exit code; under Phalanx's launcher, each machine's local rank 0 hands the
    verdict to its launcher in a file (the workers exit 0: the agent does not restart)."""
    path = os.environ.get(protocol.DOCTOR_RESULT)
    if path is None:
        return 1 if failed else 0
    if local_rank() == 0:  # a link planted at the name is replaced, never written through
        atomic_write(path, "1" if failed else "0")
    return 0


def reachability(store, timeout_s: float) -> tuple[list[str], int]:
    """Who cannot reach whom where the collectives connect (phalanx.doctor.reach), checked
    before the process group is made: a failure there would hang its creation."""
    import torch

    from phalanx.doctor.reach import probe

    var = "NCCL_SOCKET_IFNAME" if torch.cuda.is_available() else "GLOO_SOCKET_IFNAME"
    return probe(store, _rank(), _world(), timeout_s, var)


def _report_unreachable(problems: list, as_json: bool) -> int:
    found = [report.Check("network", "machines reach each other", "fail", line,
                          "open the ports between the machines (firewall), or point "
                          "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME at an interface the other "
                          "machines can route to") for line in problems]
    if has_ranks() and global_rank() == 0:
        print(report.as_json(found, []) if as_json else report.render_table(found, []),
              flush=True)
    return _verdict(True)


def _torch_defaults(name: str) -> dict:
    """The strategy's options left at torch's defaults (DDP: not a static graph)."""
    return {"static_graph": False} if hasattr(spec(name).options(), "static_graph") else {}


def wait_for_peers(store, rank: int, world: int, timeout: float) -> None:
    """Each rank checks in on the job's store; after `timeout`, name those that never did
    (rather than torch's 'timed out waiting for clients', which names nobody)."""

    store.set(f"joined/{rank}", "1")
    deadline = time.monotonic() + timeout
    while True:
        missing = [r for r in range(world) if not store.check([f"joined/{r}"])]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise DistributedError(
                f"rendezvous: rank(s) {', '.join(map(str, missing))} of {world} never joined "
                f"within {timeout:g} s. Check that every node started (same MASTER_ADDR/PORT, "
                f"same --nnodes/WORLD_SIZE), and the firewall between nodes.", missing)
        time.sleep(0.1)


def _world() -> int:
    """The world of the agent that started this rank (Phalanx's or torchrun's), whose
    store the peer checks meet on; 1 elsewhere — under a plain `srun` there is no such
    store, and `phalanx.init` meets through SLURM's own (`slurm_store`)."""
    return launched_world() or 1


def _rank() -> int:
    return global_rank() or 0
