"""A `phalanx train` run below the command line (which cli/train.py parses): everything
that can be checked before launching, the run directory held (launch.hold), then the
workers launched (or, under torchrun/SLURM, this process is one) — or, with
`--fault-tolerance torchft`, one launcher per replica group; and a worker of Phalanx's
launcher, started from the job it was handed (`run_job`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
from pathlib import Path

from phalanx.checkpoint.rundir import one_run, prepare_out_dir
from phalanx.cluster import protocol
from phalanx.cluster.faults import announce
from phalanx.cluster.protocol import one_machine_worker, under_launcher
from phalanx.cluster.startup_trace import mark
from phalanx.config.sections import Config
from phalanx.data.corpus import check_data, prepare_data
from phalanx.errors import Interrupted, storage_errors
from phalanx.launch.hold import created_here, held, refused_leaves_nothing
from phalanx.launch.job import Job
from phalanx.launch.job import write as write_job
from phalanx.launch.ranks import run_ranks
from phalanx.paths import RunDir, refuse_link
from phalanx.train.worker import (
    check_data_fits,
    check_model,
    complete_quietly,
    owns_run_dir,
    stopped_line,
    worker,
)


def train_config(cfg: Config, argv: list[str], memory=None) -> int:
    """`phalanx train` with the settings `cfg` (`argv`: the command line they came from,
    said back in "Resume with: …"); `memory(world)`: said beside a rank the kernel killed
    (the CLI hands down phalanx.plan.oom's predicted peak)."""
    announce()  # checked, and said in one line when set
    check_data(cfg.data, cfg.train.out)  # `--data`, `--tokenizer` readable (and `--out`
    # not in `--data`) before anything is written
    if cfg.model.factory is not None:  # and `--model` importable (built once data is read)
        from phalanx.models.user import load_factory

        load_factory(cfg.model.factory)
    group = protocol.replica_group()  # (name, lighthouse): this is a torchft replica group
    ft_launcher = cfg.dist.fault_tolerance != "none" and group is None
    if ft_launcher:  # what torchft cannot do yet: refused before anything is written
        from phalanx.ft.groups import check as check_fault_tolerance

        check_fault_tolerance(cfg)
    created = created_here(cfg.train.out)
    if group is not None:  # OUT/replica-G is inside the job's OUT: never a link
        refuse_link(Path(cfg.train.out).expanduser(), "in a torchft run directory")
    out = prepare_out_dir(cfg.train.out)
    with refused_leaves_nothing(out, created):
        if ft_launcher:
            return _launch_groups(cfg, out, argv)
        with quiet_store_retries(cfg), storage_errors(out):  # e.g. metrics on a full disk
            return _train_in(cfg, out, argv, None if group is None else group[0], memory)


def _launch_groups(cfg: Config, out: RunDir, argv: list[str]) -> int:
    """`--fault-tolerance torchft`: OUT locked and checked as any run directory (no link
    in it, a replica group's included; one run), then a lighthouse and a `phalanx train`
    a group, each with its share of the cores."""
    from phalanx.ft.groups import group_count, run_groups
    from phalanx.launch.agent import threads_per_rank
    from phalanx.train.checkpointing import start_lineage

    one_run(out, True, cfg.train.resume)
    with held(out):
        if cfg.train.resume == "never":  # a fresh start: the earlier run moves aside
            start_lineage(out, None, lambda line: print(f"phalanx: {line}", flush=True))
        threads = threads_per_rank(group_count(cfg.dist), cfg.dist.threads_per_rank)

        def hand(name: str, group_argv: list[str]) -> dict[str, str]:
            """Group NAME's job (one rank, its share of the cores, its OUT/replica-NAME),
            written in OUT, which this launcher holds locked."""
            group = dataclasses.replace(
                cfg, train=dataclasses.replace(cfg.train, out=str(out.replica(name))),
                dist=dataclasses.replace(cfg.dist, nproc_per_node=1, threads_per_rank=threads))
            job = Job("train", group, out.replica(name).absolute(), tuple(group_argv),
                      ft_group=name)
            return {protocol.JOB: str(write_job(job, out.group_job(name)).absolute())}

        return run_groups(cfg, argv, out.root, threads,
                          lambda folder: complete_quietly(cfg, RunDir(folder)), hand)


def _train_in(cfg: Config, out: RunDir, argv: list[str], group: str | None,
              memory=None) -> int:
    from phalanx.checkpoint.resume import verified_token
    from phalanx.train.checkpointing import precheck, start_lineage
    from phalanx.train.outputs import missing_outputs

    if not owns_run_dir(cfg):  # rank > 0, or a launcher of several: rank 0 checks
        if complete_quietly(cfg, out):
            return 0  # rank 0 found the same and does not join the process group
        if under_launcher():  # this process is a rank
            return _ranks(cfg, out, argv)
        return _machine_launcher(cfg, out, argv, memory)
    if cfg.dist.fault_tolerance == "none":  # (a torchft group: its launcher checked)
        one_run(out, False, cfg.train.resume)
    with held(out, record=False) as lock:  # recorded once the checks pass
        splits = prepare_data(cfg.data)
        check_data_fits(cfg, splits)
        check_model(cfg, splits.vocab_size)
        resume_from, complete = precheck(cfg, out, splits.tokenizer_record(),
                                         splits.corpus_record())
        mark("corpus and checkpoints checked")
        missing = missing_outputs(cfg, out) if complete else []
        if complete and not missing:
            print(f"phalanx: {complete}", flush=True)
            return 0
        if missing:  # stopped while it wrote them: written again from the last checkpoint
            assert resume_from is not None  # complete: precheck found a checkpoint
            print(f"phalanx: the run is complete but {', '.join(missing)} "
                  f"{'is' if len(missing) == 1 else 'are'} missing: writing "
                  f"{'it' if len(missing) == 1 else 'them'} from {resume_from.name}.",
                  flush=True)
        lock.record_holder()
        start_lineage(out, resume_from, lambda line: print(f"phalanx: {line}", flush=True))
        verified = None if resume_from is None else verified_token(resume_from)
        job = Job("train", cfg, out.root.absolute(), tuple(argv), verified,
                  ft_group=group)
        try:
            return run_ranks(cfg, "train", argv,
                             lambda t, c: worker(cfg, splits, out, t, argv, c, verified), out,
                             job=job, memory=memory)
        except Interrupted as exc:  # the workers committed a checkpoint and stopped
            if precheck(cfg, out)[1] and not missing_outputs(cfg, out):
                print(f"phalanx: {signal.Signals(exc.signum).name} came after the last "
                      f"step: the run is complete and every output is written.", flush=True)
                return 0  # nothing to resume
            raise Interrupted(exc.signum, stopped_line(exc.signum, out, argv)) from None


def _machine_launcher(cfg: Config, out: RunDir, argv: list[str], memory=None) -> int:
    """One machine's launcher of a several-machine run: its workers start from a job of
    their own (settings and command line; global rank 0 checks and locks the run as a
    worker, `run_job`), removed when this launcher ends."""
    import socket

    path = out.launcher_job(socket.gethostname(), os.getpid())
    try:
        return _ranks(cfg, out, argv, job=Job("train", cfg, out.root.absolute(), tuple(argv)),
                      job_path=path, memory=memory)
    finally:
        path.unlink(missing_ok=True)


def run_job(job: Job) -> int:
    """A worker of Phalanx's launcher: the run as the launcher decided it (`job`), with no
    command line parsed and nothing decided again but this attempt's own (the world it
    joins, its rank, the strategy for that world: `train.worker.init_run`)."""
    cfg, out = job.config, RunDir(job.out)
    mark("job read")
    if not one_machine_worker():  # a torchft replica group's launcher, or a worker of a
        # several-machine run (global rank 0 checks and holds the run): the run, as handed
        return train_config(cfg, list(job.argv))
    with storage_errors(out):
        return _ranks(cfg, out, list(job.argv), job.verified)


def _ranks(cfg: Config, out: RunDir, argv: list[str], verified: str | None = None,
           job: Job | None = None, job_path: Path | None = None, memory=None) -> int:
    """A process that checks nothing (rank 0 or the launcher did, and says the notes):
    the corpus read, then this process's rank(s) (`run_ranks`); `verified`: the checkpoint
    the launcher verified in full (its job's); `job`: handed to the ranks, at `job_path`."""
    splits = prepare_data(cfg.data, log=lambda line: None)
    mark("corpus checked")
    return run_ranks(cfg, "train", argv,
                     lambda t, c: worker(cfg, splits, out, t, argv, c, verified), out,
                     job=job, job_path=job_path, memory=memory)


@contextlib.contextmanager
def quiet_store_retries(cfg: Config):
    """A launcher of several machines, before it imports torch: torch's store client
    prints a C++ trace per retry while the other machines are not up yet; Phalanx says
    what is wrong in one line (`launch_workers` gives workers torch's level back). The
    variables are put back afterwards (torch reads the level once, at import)."""
    quiet = cfg.dist.node_range()[1] > 1 and not under_launcher() \
        and "TORCH_CPP_LOG_LEVEL" not in os.environ
    if quiet:
        os.environ.update({"TORCH_CPP_LOG_LEVEL": "FATAL", protocol.QUIET_CPP: "1"})
    try:
        yield
    finally:
        if quiet:
            for name in ("TORCH_CPP_LOG_LEVEL", protocol.QUIET_CPP):
                os.environ.pop(name, None)


