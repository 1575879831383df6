"""`phalanx train`: check everything that can be checked before launching, then launch
workers (or, under torchrun/SLURM, be one) and train on the public API."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
from pathlib import Path

from phalanx.cluster.rendezvous import restart_attempt
from phalanx.config.sections import Config
from phalanx.checkpoint.rundir import remove_if_unused
from phalanx.data.corpus import TokenSplits, prepare, source_files
from phalanx.cluster.env import under_launcher
from phalanx.errors import Interrupted, UserError, storage_errors
from phalanx.cluster.faults import check_faults
from phalanx.cluster.lifecycle import exit_code
from phalanx.cluster.startup_trace import mark
from phalanx.config.flags import add_config_flags, resolve
from phalanx.paths import create_new
from phalanx.strategies import default_name, spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)


def prepare_out_dir(path: str) -> Path:
    """Create the run directory and prove it is writable, or say why it is not."""
    out = Path(path).expanduser()
    probe = out / f".phalanx-write-test-{os.getpid()}"  # one per rank: no race
    try:
        out.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # left by a process SIGKILLed here
            probe.unlink()  # (unlink removes a link, never what it points to)
        create_new(probe, "ok")  # O_EXCL: never through a link planted at its name
        probe.unlink()
    except OSError as exc:
        raise UserError(f"`--out` `{path}` is not a writable directory ({exc.strerror}). "
                        f"Choose a directory you can write to.") from None
    return out


def check_data_fits(cfg: Config, splits: TokenSplits) -> None:
    """Both splits must hold at least one window of `block_size + 1` tokens."""
    need = cfg.model.block_size + 1
    for name, n in (("training", splits.n_train), ("validation", splits.n_val)):
        if n < need:
            raise UserError(
                f"`--block-size` {cfg.model.block_size} is longer than the corpus allows: the "
                f"{name} split of `{splits.description}` has {n} tokens and one sample needs "
                f"{need}. Use a smaller `--block-size` or more text in `--data`.")


def check_world(cfg: Config, nproc: int, cuda: bool) -> None:
    """Checks that need the world size and device kind, done before any worker starts:
    the strategy's own (its spec's, the same a worker runs) and the backend's."""
    found = spec(cfg.dist.strategy or default_name(nproc))
    found.check(found.options_from(cfg.dist), nproc, cuda)
    if cfg.dist.backend == "nccl" and not cuda:
        raise UserError("`--backend nccl` needs CUDA GPUs and none is visible; use gloo.")


def owns_run_dir(cfg: Config) -> bool:
    """Whether this process is the run directory's one writer-to-be: the launcher of a
    one-machine job, or under a launcher (torchrun, SLURM, Phalanx's own for several
    machines) the global rank 0. Phalanx's own one-machine workers run under a launcher
    that holds the lock already."""
    if not under_launcher():
        return cfg.dist.node_range()[1] == 1  # several machines: global rank 0 locks
    return not _own_launcher_checked() and os.environ.get(
        "RANK", os.environ.get("SLURM_PROCID", "0")) == "0"


def run_train(ns: argparse.Namespace, argv: list[str]) -> int:
    cfg = resolve(ns)
    mark("config resolved")
    check_faults()
    source_files(cfg.data.path)  # `--data` is readable before anything is written
    created = not Path(cfg.train.out).expanduser().exists()
    out = prepare_out_dir(cfg.train.out)
    try:
        with quiet_store_retries(cfg), storage_errors(out):  # e.g. metrics on a full disk
            return _train_in(cfg, out, argv)
    except UserError:
        if created:  # refused before anything ran: leave no empty run directory behind
            remove_if_unused(out)
        raise


def _train_in(cfg: Config, out: Path, argv: list[str]) -> int:
    from phalanx.checkpoint.resume import VERIFIED_ENV, verified_token
    from phalanx.checkpoint.rundir import RunDirLock
    from phalanx.train.checkpointing import precheck, start_lineage
    from phalanx.train.finish import missing_outputs

    if not owns_run_dir(cfg):  # rank > 0, or a launcher of several: rank 0 checks
        if not _own_launcher_checked() and _complete_quietly(cfg, out):
            return 0  # rank 0 found the same and does not join the process group
        splits = prepare(cfg.data.path, cfg.data.cache_dir, cfg.data.val_fraction)
        mark("corpus checked")
        return run_ranks(cfg, "train", argv, lambda t: worker(cfg, splits, out, t))
    with RunDirLock(out) as lock:  # one run per directory; dropped when this process ends
        splits = prepare(cfg.data.path, cfg.data.cache_dir, cfg.data.val_fraction)
        check_data_fits(cfg, splits)
        resume_from, complete = precheck(cfg, out)
        mark("corpus and checkpoints checked")
        missing = missing_outputs(cfg, out) if complete else []
        if complete and not missing:
            print(f"phalanx: {complete}", flush=True)
            return 0
        if missing:  # stopped while it wrote them: written again from the last checkpoint
            print(f"phalanx: the run is complete but {', '.join(missing)} "
                  f"{'is' if len(missing) == 1 else 'are'} missing: writing "
                  f"{'it' if len(missing) == 1 else 'them'} from {resume_from.name}.",
                  flush=True)
        lock.record_holder()
        start_lineage(out, resume_from, lambda line: print(f"phalanx: {line}", flush=True))
        verified = {} if resume_from is None else {VERIFIED_ENV: verified_token(resume_from)}
        try:
            return run_ranks(cfg, "train", argv, lambda t: worker(cfg, splits, out, t, argv),
                             verified)
        except Interrupted as exc:  # the workers committed a checkpoint and stopped
            if precheck(cfg, out)[1] and not missing_outputs(cfg, out):
                print(f"phalanx: {signal.Signals(exc.signum).name} came after the last "
                      f"step: the run is complete and every output is written.", flush=True)
                return 0  # nothing to resume
            raise Interrupted(exc.signum, stopped_line(exc.signum, out, argv)) from None


def _own_launcher_checked() -> bool:
    """A worker of Phalanx's one-machine launcher, which checked the run before starting
    it (`precheck`): nothing to check again."""
    return bool(os.environ.get("PHALANX_LAUNCHED")) and not os.environ.get("PHALANX_MULTINODE")


def _complete_quietly(cfg: Config, out: Path) -> bool:
    """Rank > 0 under another launcher: does rank 0 find the run complete? (Read-only;
    any error is rank 0's to report, so it means 'no' here.)"""
    from phalanx.train.checkpointing import precheck
    from phalanx.train.finish import missing_outputs

    try:
        return precheck(cfg, out)[1] is not None and not missing_outputs(cfg, out)
    except Exception:  # noqa: BLE001 - rank 0 reports it in one line
        return False


def stopped_line(signum: int, out: Path, argv: list[str]) -> str:
    """`stopped by SIGINT: checkpoint step-… is committed. Resume with: phalanx train …`"""
    from phalanx.checkpoint.store import read_latest

    latest = read_latest(out / "checkpoints")
    kept = (f"checkpoint {latest.name} is committed" if latest is not None and latest.is_dir()
            else "no checkpoint was committed yet")
    args, skip = [], False
    for a in argv:  # the resume command continues: no `--resume never` / PATH
        if skip or a == "--resume" or a.startswith("--resume="):
            skip = a == "--resume"
            continue
        args.append(a)
    return (f"stopped by {signal.Signals(signum).name}: {kept}. Resume with: "
            f"{shlex.join(['phalanx', 'train', *args])}")


def run_ranks(cfg: Config, verb: str, argv: list[str], work,
              env: dict[str, str] | None = None) -> int:
    """`phalanx VERB ARGV` on the config's ranks (phalanx.launch.agent.launch_or_work), after
    the checks that need the world size (`check_world`); `env`: more for the workers."""
    from phalanx.launch.agent import launch_or_work
    from phalanx.cluster.ranklogs import LOGS_ENV

    def check(plan) -> None:
        import torch

        from phalanx.train.cpu_estimate import cpu_warning

        check_world(cfg, plan.world, torch.cuda.is_available())
        slow = None if torch.cuda.is_available() else cpu_warning(cfg, plan.threads)
        if slow:  # up front, before minutes pass in silence
            print(f"phalanx: {slow}", file=sys.stderr, flush=True)

    logs = {} if cfg.dist.tee_ranks else {LOGS_ENV: str(Path(cfg.train.out).resolve() / "logs")}
    return launch_or_work(cfg.dist, ["-m", "phalanx", verb, *argv], work,
                          env={**logs, **(env or {})}, check=check)


@contextlib.contextmanager
def quiet_store_retries(cfg: Config):
    """A launcher of several machines, before it imports torch: torch's store client
    prints a C++ trace per retry while the other machines are not up yet; Phalanx says
    what is wrong in one line (`launch_workers` gives workers torch's level back). The
    variables are put back afterwards (torch reads the level once, at import)."""
    quiet = cfg.dist.node_range()[1] > 1 and not under_launcher() \
        and "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ.update(TORCH_CPP_LOG_LEVEL="FATAL", PHALANX_QUIET_CPP="1")
    try:
        yield
    finally:
        if quiet:
            for name in ("TORCH_CPP_LOG_LEVEL", "PHALANX_QUIET_CPP"):
                os.environ.pop(name, None)


def init_run(cfg: Config, threads: int | None, out: Path | None = None):
    """`phalanx.init` with the config's backend, strategy and its options; the hang
    watchdog reports into `out`."""
    import phalanx

    d = cfg.dist
    return phalanx.init(cfg.train.seed, backend=d.backend, strategy=d.strategy,
                        timeout_s=d.timeout_s, threads=d.threads_per_rank or threads,
                        hang_timeout_s=d.hang_timeout_s or None, hang_report_dir=out,
                        debug_collectives=d.debug_collectives, **strategy_options(cfg))


def strategy_options(cfg: Config, world: int | None = None) -> dict:
    """The chosen strategy's options from the config (its spec's fields only).

    DDP's `static_graph` applies only without accumulation: under it torch cannot skip
    the gradient sync before its first synchronised iteration, so the first window would
    sync every micro-step — the same gradient up to float rounding, but not bit-for-bit
    the windows that follow or a resumed run's first one.
    """
    name = cfg.dist.strategy or default_name(world if world is not None else _world())
    options = dataclasses.asdict(spec(name).options_from(cfg.dist))
    if "static_graph" in options:
        options["static_graph"] = options["static_graph"] and cfg.train.grad_accum == 1
    return options


def _world() -> int:
    """This process's world size as the runtime will see it: torchrun's variables, or
    SLURM's under a plain `srun` (WORLD_SIZE is not set there — reading only it chose
    `single` and dropped every DDP option the user gave, while the runtime built DDP)."""
    from phalanx.cluster.env import detect_launch_env

    return detect_launch_env().world_size


def worker(cfg: Config, splits: TokenSplits, out: Path, threads: int | None = None,
           argv: list[str] | None = None) -> int:
    """One rank: init the runtime, train, and (rank 0) write the results. Stopped by a
    signal: commit a checkpoint, say how to resume, exit 130 (SIGINT) / 143 (SIGTERM).
    A signal once every step is done does not stop the final outputs (seconds): the
    run is complete, it writes them and exits 0."""
    from phalanx.train.agreement import check_agreement
    from phalanx.train.finish import finish, banner
    from phalanx.train.loop import train

    # one stop-signal scope from the process group to the last output: a first signal
    # before the loop is agreed at its first step; after it, the outputs are still written
    with init_run(cfg, threads, out) as run, run.catch_stop_signals():
        mark("process group up")
        check_agreement(run, cfg, splits)  # every rank: the same settings, or one line
        if not restart_attempt():  # a restart says so in one line when it resumes
            run.print(banner(cfg, run, splits))
        result = train(cfg, run, splits, out)
        if result.stopped and result.state.step < cfg.train.max_steps:
            if run.is_main and not os.environ.get("PHALANX_LAUNCHED"):  # else the launcher
                print(f"phalanx: {stopped_line(result.stopped, out, argv or [])}",
                      file=sys.stderr, flush=True)
            return exit_code(result.stopped)  # closing the run waits for rank 0 (a barrier)
        finish(cfg, run, result, out, splits)  # every rank: sharded weights gathered
    return 0
