"""`python -m phalanx.hang SCRIPT [ARGS...]`: run an unmodified training script with the
hang watchdog, e.g. `torchrun --nproc-per-node 2 -m phalanx.hang train.py`.

The watchdog starts as soon as the script's `init_process_group` returns. Settings come
from the environment: PHALANX_HANG_TIMEOUT (seconds, default 300; 0: no watchdog) and
PHALANX_HANG_REPORT_DIR (default: the current directory). This is also what each rank of
`phalanx run` runs (its launcher sets those, PHALANX_RUN_DIR and PHALANX_RANK_LOGS); under
torchrun or srun, `phalanx run SCRIPT` calls `run_script` itself.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys

from phalanx.cluster import protocol


def _patch_init(watch: bool) -> list:
    """Wrap `torch.distributed.init_process_group` for the script: under Phalanx's agent an
    env:// init meets in this restart attempt's own key space (`attempt_store`: after a
    restart the agent's store still holds the dead ranks' addresses); with `watch`, the
    hang watchdog starts as soon as it returns (the list returned holds it then)."""
    import torch.distributed as dist

    from phalanx.hang.watchdog import start_watchdog

    original, dogs = dist.init_process_group, []

    def init_process_group(*args, **kwargs):
        if protocol.phalanx_worker() and len(args) <= 1 and kwargs.get("store") is None \
                and kwargs.get("init_method") in (None, "env://"):
            kwargs.update(_attempt_rendezvous(kwargs.get("timeout")))
        result = original(*args, **kwargs)
        if watch:
            dogs.append(start_watchdog(dist.get_rank(), dist.get_world_size(),
                                       hang_timeout(), os.environ.get(protocol.HANG_REPORT_DIR)))
            os.environ[protocol.WATCHED] = "1"  # phalanx.init in the script: no second one
        return result

    dist.init_process_group = init_process_group
    return dogs


def _attempt_rendezvous(timeout) -> dict:
    """`store=`, `rank=`, `world_size=` for an env:// init under Phalanx's agent ({} when
    the agent's store is not shared with the workers)."""
    import datetime

    from phalanx.cluster.env import global_rank, launched_world
    from phalanx.cluster.rendezvous import attempt_store

    world = launched_world() or 1
    store = attempt_store(world, timeout or datetime.timedelta(minutes=30))
    if store is None:
        return {}
    return {"store": store, "rank": global_rank() or 0, "world_size": world,
            "init_method": None}


def hang_timeout() -> float:
    """PHALANX_HANG_TIMEOUT in seconds (default 300; 0: no watchdog); a bad value is one
    line and exit 2."""
    from phalanx.errors import UserError
    from phalanx.hang.watchdog import timeout_from_env

    try:
        return timeout_from_env(default="300")
    except UserError as exc:
        print(f"phalanx: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def run_script(script: str, args: list[str], watch: bool = True) -> None:
    """Run `script` as `__main__` with `args` (its sys.argv[1:]), the hang watchdog
    started after its `init_process_group` (unless not `watch`; see `_patch_init`). Its
    uncaught error is recorded for the agent; under quiet ranks its traceback goes to this
    rank's log only (the launcher shows it once) and the process exits with 1 (2: a
    Phalanx usage error)."""
    dogs = _patch_init(watch)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    from phalanx.cluster.protocol import record_for_agent
    from phalanx.cluster.ranklogs import rank_log
    from phalanx.errors import UserError
    from phalanx.hang.mismatch import explain

    try:
        runpy.run_path(script, run_name="__main__")
        _finished(dogs)
    except SystemExit as exc:
        if exc.code in (0, None):
            _finished(dogs)
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C: the launcher says it once (exit 130)
        _from_script(exc, script)
        if _uncaught_into_log(exc):
            raise SystemExit(130) from None
        raise
    except Exception as exc:  # for the launcher's account: where each rank failed
        _from_script(exc, script)
        plain = explain(exc) or _ended_early(exc, dogs)
        if plain is None:
            record_for_agent(exc)
            if _uncaught_into_log(exc):  # the launcher shows it once
                raise SystemExit(2 if isinstance(exc, UserError) else 1) from None
            raise
        if _uncaught_into_log(exc):  # the whole message in this rank's log too
            with rank_log() as log:
                print(f"phalanx: error: {plain}", file=log, flush=True)
        if not record_for_agent(plain):
            print(f"phalanx: error: {plain}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _from_script(exc: BaseException, script: str) -> None:
    """Start `exc`'s traceback at the script's own frame: this module's and runpy's frames
    above it are how the script was started, not where it failed (kept when the script's
    frame is not in it, e.g. an error while it was being read)."""
    path, frames = os.path.abspath(script), exc.__traceback__
    while frames is not None and os.path.abspath(frames.tb_frame.f_code.co_filename) != path:
        frames = frames.tb_next
    if frames is not None:
        exc.__traceback__ = frames


def _finished(dogs: list) -> None:
    for dog in dogs:
        dog.finished()


def _ended_early(exc: BaseException, dogs: list):
    """A `DistributedError` saying "uneven inputs" when this rank lost a peer in a
    collective because the peer's script had returned; None otherwise."""
    from phalanx.hang.mismatch import PEER_LOST
    from phalanx.hang.uneven import ended_early

    if not dogs or not isinstance(exc, RuntimeError) or \
            not any(m in str(exc) for m in PEER_LOST):
        return None
    done = dogs[0].finished_ranks(wait=2.0)
    return ended_early(exc, dogs[0].rank, done, dogs[0].beat_state) if done else None


def _uncaught_into_log(exc: BaseException) -> bool:
    """Under quiet ranks: hand `exc` to `sys.excepthook` as if it were uncaught (the
    script's or phalanx.init's hook runs: the run is closed as failed), with what the hook
    writes to stderr going to this rank's log only. False when output is not quieted (the
    caller re-raises: the hook runs as usual)."""
    from phalanx.cluster.ranklogs import rank_log

    with rank_log() as log:
        if log is None:
            return False
        with contextlib.redirect_stderr(log):
            sys.excepthook(type(exc), exc, exc.__traceback__)
    return True


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m phalanx.hang SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    script = sys.argv[1]
    if not os.path.isfile(script):
        print(f"phalanx: error: `{script}` is not a file.", file=sys.stderr)
        raise SystemExit(2)
    watch = hang_timeout() > 0
    from phalanx.cluster.lifecycle import die_with_agent

    die_with_agent()
    from phalanx.cluster.ranklogs import quiet_worker

    quiet_worker()  # under Phalanx's launcher: this rank's output goes to its log
    from phalanx.cluster.lingering import end_despite_threads, exit_code

    try:
        run_script(script, sys.argv[2:], watch)
    except BaseException as exc:  # its traceback or exit code as Python gives it; a thread
        end_despite_threads(exit_code(exc))  # the script left running (not a daemon) does
        raise  # not hang the rank, nor the job waiting for it
    end_despite_threads(0)


if __name__ == "__main__":
    main()
