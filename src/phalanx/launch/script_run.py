"""A `phalanx run` (or `watch`) below the command line (which cli/run.py parses): the run
directory made and held (launch.hold), the ranks launched, each as
`python -m phalanx.hang SCRIPT ARGS`, the run recorded (events, report, restarts) and a
stop said with the command that resumes it — or, under torchrun / srun, this process is
one rank and global rank 0 holds the run directory."""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

from phalanx.checkpoint.rundir import prepare_out_dir
from phalanx.cluster import protocol
from phalanx.cluster.faults import announce
from phalanx.cluster.protocol import under_launcher
from phalanx.cluster.rendezvous import restart_note
from phalanx.config.sections import DistConfig
from phalanx.errors import Interrupted, UserError
from phalanx.errors import stopped_line as said_stopped
from phalanx.launch.hold import created_here, held, refused_leaves_nothing
from phalanx.paths import RunDir
from phalanx.report.account import recorded, restarts_said, step_now
from phalanx.report.events import record_event


@dataclasses.dataclass(frozen=True)
class ScriptRun:
    """A user's script run, as its command line said it."""

    verb: str  # "run", or "watch" (its older name)
    script: str
    args: tuple[str, ...]  # the script's own arguments
    dist: DistConfig
    out: str | None  # the run directory as given (None: a new name is made)
    out_flag: str  # the flag that gave it ("--out" / "--report-dir"), named in errors
    hang_timeout_s: float  # 0: the watchdog is off
    debug_collectives: bool
    argv: tuple[str, ...]  # the verb's command line, said back in "Resume with: …"


def run_script_job(run: ScriptRun) -> int:
    """Be one rank under a launcher, else make and lock the run directory and launch the
    ranks."""
    from phalanx.cluster.nodes import node_plan
    from phalanx.launch.agent import launch_or_work  # lazy: `phalanx --help` loads every verb

    announce()  # PHALANX_FAULT checked, and said in one line when set
    if under_launcher():  # torchrun or srun: this process is a rank
        _as_torchrun()
        out = _worker_out(run)
        os.environ.update(_run_env(run, out))  # before the script imports torch.distributed
        return launch_or_work(run.dist, [], lambda _threads: _work(run, out))
    nodes = node_plan(run.dist)  # several machines: each launcher names the same OUT
    given = run.out or (f"runs/{run.verb}-{run.dist.rdzv_id}" if nodes else _new_out(run.verb))
    created = created_here(given)
    out = RunDir(_make_out(given, run).root.resolve())
    if nodes is not None and not nodes.is_host:  # the rendezvous host's launcher holds OUT
        return _launch(run, out, None)
    with refused_leaves_nothing(out, created), held(out):  # one run per directory
        return _launch(run, out, given)


def _new_out(verb: str) -> str:
    """`runs/run-<time>` (`runs/watch-<time>`), new: a suffix when that name is taken."""
    base = time.strftime(f"runs/{verb}-%Y%m%d-%H%M%S")
    path, n = base, 1
    while os.path.lexists(path):
        path, n = f"{base}-{n}", n + 1
    return path


def _make_out(path: str, run: ScriptRun) -> RunDir:
    """The run directory, created (a UserError naming the flag when it cannot be)."""
    flag = run.out_flag
    try:
        Path(path).expanduser().mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"`{flag}` `{path}` cannot be created ({exc.strerror}). Choose a "
                        f"directory you can write to.") from None
    return prepare_out_dir(path)


def _run_env(run: ScriptRun, out: RunDir) -> dict[str, str]:
    """What every rank finds in its environment (set by the launcher, or by the rank
    itself under another launcher): the watchdog's settings, and the run directory."""
    env = {protocol.HANG_TIMEOUT: f"{run.hang_timeout_s:g}",
           protocol.HANG_REPORT_DIR: str(out.root), protocol.RUN_DIR: str(out.root),
           protocol.STRAGGLER_EVERY: str(run.dist.straggler_every)}
    if run.dist.strategy:  # phalanx.init builds it; a script naming another is refused
        env[protocol.STRATEGY] = run.dist.strategy
    if run.debug_collectives:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    return env


# --- the launcher ------------------------------------------------------------------------

def _launch(run: ScriptRun, out: RunDir, given: str | None) -> int:
    """Start the ranks (`python -m phalanx.hang SCRIPT ARGS` each). `given`: the `--out` to
    name in the resume command, when this launcher holds the run directory (None: another
    machine's launcher does) and records the run."""
    from phalanx.launch.agent import default_nproc, launch_or_work

    dist, verb = run.dist, run.verb
    env = _run_env(run, out)
    if not dist.tee_ranks:
        env[protocol.RANK_LOGS] = str(out.logs)
    logs = "" if dist.tee_ranks else "the ranks' logs (logs/rank-R.log), "
    print(f"phalanx: {verb}: {logs}metrics, events, the report and any hang report go to "
          f"{out.root}/", file=sys.stderr, flush=True)
    command = ["-m", "phalanx.hang", run.script, *run.args]
    if given is None:
        return launch_or_work(dist, command, None, env=env)
    ranks = dist.nproc_per_node or default_nproc()
    started = f"started {shlex.join([run.script, *run.args])} on {ranks} rank(s)"
    try:
        with recorded(out, started):
            launch_or_work(dist, command, None, env=env,
                           on_failure=restarts_said(out, dist.max_restarts))
    except Interrupted as exc:  # the ranks stopped (a script's run.save committed first)
        raise Interrupted(exc.signum, stopped_line(exc.signum, out, resume_command(
            list(run.argv), run.args, given))) from None
    print(f"phalanx: {verb}: done; the run on one page: {out.report}", file=sys.stderr,
          flush=True)
    return 0


def resume_command(argv: list[str], args: tuple[str, ...], out: str) -> str:
    """`phalanx run --out OUT [flags] SCRIPT ARGS`: this run's command line, continued in
    the same run directory (`--out`/`--report-dir` replaced; the script's own arguments
    kept as they are)."""
    at = len(argv) - len(args) - 1  # where SCRIPT is: flags before, its arguments after
    flags, skip = [], False
    for arg in argv[:at]:
        if skip or arg in ("--out", "--report-dir"):
            skip = not skip and arg in ("--out", "--report-dir")
            continue
        if not arg.startswith(("--out=", "--report-dir=")):
            flags.append(arg)
    return shlex.join(["phalanx", "run", "--out", out, *flags, *argv[at:]])


def stopped_line(signum: int, out: RunDir, command: str) -> str:
    """`stopped by SIGINT: checkpoint step-… is committed. Resume with: phalanx run …`
    (the newest committed checkpoint under OUT/checkpoints, when the script saved there)."""
    from phalanx.checkpoint.store import read_latest

    latest = read_latest(out.checkpoints)
    kept = (f"checkpoint {latest.name} is committed" if latest is not None
            and latest.is_dir() else "")
    return said_stopped(signum, kept, command)


# --- a rank ------------------------------------------------------------------------------

def _worker_out(run: ScriptRun) -> RunDir:
    """A rank's run directory under torchrun / srun: `--out`, else a name every rank of
    the job agrees on (`_job_out`)."""
    return RunDir(_make_out(run.out or _job_out(run.verb), run).root.resolve())


def _job_out(verb: str) -> str:
    """`runs/run-<job>` under torchrun / srun without `--out`: named after the job (SLURM's
    job and step, or torchrun's run id), the same on every rank. Without either (torchrun
    without `--rdzv-id`/`--standalone`: run id "none") a fixed name would make unrelated
    runs share a directory and resume each other's checkpoints: refused."""
    e = os.environ
    if e.get("SLURM_JOB_ID"):
        job = f"slurm-{e['SLURM_JOB_ID']}.{e.get('SLURM_STEP_ID', '0')}"
    elif e.get("TORCHELASTIC_RUN_ID", "none") not in ("", "none"):
        job = e["TORCHELASTIC_RUN_ID"]
    else:
        raise UserError(f"`phalanx {verb}` under torchrun found no job name to name its run "
                        f"directory after (torchrun's run id is 'none'), and one fixed name "
                        f"would let unrelated runs resume each other's checkpoints. Give "
                        f"`--out DIR` (the same on every rank), or torchrun `--standalone` "
                        f"or `--rdzv-id ID`.")
    return f"runs/{verb}-{''.join(c if c.isalnum() or c in '.-_' else '_' for c in job)}"


def _as_torchrun() -> None:
    """Under plain srun: the variables torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE; MASTER_ADDR/PORT unless set), for a script's env:// init."""
    from phalanx.cluster.env import detect_launch_env, has_ranks

    if has_ranks():
        return
    env = detect_launch_env()
    os.environ.update({"RANK": str(env.rank), "LOCAL_RANK": str(env.local_rank),
                       "WORLD_SIZE": str(env.world_size),
                       "LOCAL_WORLD_SIZE": str(env.local_world_size)})
    for name, value in env.rendezvous:
        os.environ.setdefault(name, value)


def _global_rank() -> str:
    from phalanx.cluster.env import global_rank

    return str(global_rank())


def _work(run: ScriptRun, out: RunDir) -> int:
    """One rank under torchrun / srun: run the script; global rank 0 also holds the run
    directory and records the run (start or restart, its end), as Phalanx's own launcher
    does otherwise."""
    from phalanx.hang.__main__ import run_script

    watch = run.hang_timeout_s > 0
    if _global_rank() != "0":
        run_script(run.script, list(run.args), watch)
        return 0
    restarted = restart_note()  # this launcher's restarts (torchrun --max-restarts)
    if restarted:
        print(f"phalanx: {restarted}", file=sys.stderr, flush=True)
    with held(out):
        if restarted:
            record_event(out, "restart", step_now(out, logged=False), restarted)
        with recorded(out, None if restarted else
                      f"started {shlex.join([run.script, *run.args])}"):
            run_script(run.script, list(run.args), watch)
    return 0
