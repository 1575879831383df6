"""`phalanx run [launch flags] [--out DIR] [--hang-timeout-s S] [--debug-collectives]
[--tee-ranks] SCRIPT [ARGS...]`: your own training script on N ranks, the twin of
`phalanx train` on the same launch path (`launch_or_work`: torch's elastic agent, or —
under torchrun / srun — this process is one rank).

The script gets a run directory (`--out`, default a new `runs/run-<time>`; locked for
the run's life, so a second run on it is refused), quiet ranks (each rank's output in
`OUT/logs/rank-R.log`, rank 0's also on the console), the hang watchdog (`--hang-timeout-s`,
300 s; its report in OUT), `PHALANX_RUN_DIR` = OUT (phalanx.init's `run.out`: metrics,
checkpoints, stop at the next `run.save`), restarts (`--max-restarts`), `OUT/events.jsonl`
(start, restarts, the end, a failure or a stop) and `OUT/report.html` at the end.

Each rank runs `python -m phalanx.hang SCRIPT ARGS` (SCRIPT as `__main__`, the watchdog
after its `init_process_group`; phalanx.hang.__main__), told the rest in its environment.
Under torchrun / srun `phalanx run SCRIPT ARGS` is that rank itself, and global rank 0
holds the run directory. `phalanx watch` is this verb under its older name (`--report-dir`
for `--out`, default `runs/watch-<time>`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from phalanx.checkpoint.rundir import RunDirLock, prepare_out_dir, remove_if_unused
from phalanx.cluster import protocol
from phalanx.cluster.faults import announce
from phalanx.cluster.protocol import under_launcher
from phalanx.cluster.rendezvous import restart_note
from phalanx.config.flags import add_launch_flags, dist_config, seconds
from phalanx.errors import Interrupted, UserError
from phalanx.paths import RunDir, require_file
from phalanx.report.account import recorded, restarts_said, step_now
from phalanx.report.events import record_event

SUMMARY = ("Run your own training script on N ranks: a run directory, quiet ranks, the hang "
           "watchdog, restarts, events and a report.")


def seconds_or_off(text: str) -> float:
    """An argparse `type=`: 0 (off), or seconds as `seconds` takes them."""
    try:
        if float(text) == 0:
            return 0.0
        return seconds(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or a finite number of seconds > 0 "
                                         f"(at most 30 days), got {text}") from None


def add_arguments(parser: argparse.ArgumentParser, watch: bool = False) -> None:
    """`phalanx run`'s flags; `watch`: `phalanx watch`'s (the same, plus `--report-dir` for
    `--out`, and a watchdog that cannot be turned off)."""
    add_launch_flags(parser, extra=("tee_ranks", "max_restarts", "threads_per_rank"))
    where = parser.add_mutually_exclusive_group()
    new = "watch" if watch else "run"
    where.add_argument("--out", default=None, metavar="DIR",
                       help="the run directory: the ranks' logs (logs/rank-R.log), metrics, "
                            "events, report.html, any hang report; the script finds it in "
                            f"PHALANX_RUN_DIR (default: runs/{new}-YYYYmmdd-HHMMSS, a new "
                            "one per run; run again with the same --out to resume)")
    if watch:
        where.add_argument("--report-dir", default=None, metavar="DIR", dest="report_dir",
                           help="the same as --out (its older name)")
    parser.add_argument("--hang-timeout-s", type=seconds if watch else seconds_or_off,
                        default=300.0, metavar="S",
                        help="report and stop when no rank progresses for S seconds "
                             + ("(default: 300)" if watch else "(default: 300; 0: off)"))
    parser.add_argument("--debug-collectives", action="store_true",
                        help="verify every collective across ranks "
                             "(TORCH_DISTRIBUTED_DEBUG=DETAIL) and explain a mismatch")
    parser.add_argument("script", metavar="SCRIPT", help="your training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")


def check_script(script: str) -> None:
    """The script must be a regular file of Python that compiles: a syntax error is the
    user's, said once here instead of once per rank."""
    path = require_file(script, "script", "Give the training script to run.")
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError as exc:
        line = (exc.text or "").strip()
        raise UserError(f"`{script}` line {exc.lineno}: {exc.msg}"
                        + (f": `{line}`" if line else "") + ". Fix the script and run again.") \
            from None
    except (OSError, ValueError) as exc:
        raise UserError(f"`{script}` cannot be read as Python: {exc}.") from None


def run_run(ns: argparse.Namespace, argv: list[str]) -> int:
    return run_verb(ns, argv, "run")


def run_verb(ns: argparse.Namespace, argv: list[str], verb: str) -> int:
    """`phalanx VERB ARGV` (run or watch): be one rank under a launcher, else lock the
    run directory and launch the ranks."""
    from phalanx.cluster.nodes import node_plan
    from phalanx.launch.agent import launch_or_work  # lazy: `phalanx --help` loads every verb

    check_script(ns.script)
    announce()  # PHALANX_FAULT checked, and said in one line when set
    if under_launcher():  # torchrun or srun: this process is a rank
        _as_torchrun()
        out = _worker_out(ns, verb)
        os.environ.update(_run_env(ns, out))  # before the script imports torch.distributed
        return launch_or_work(dist_config(ns), [], lambda _threads: _work(ns, out))
    dist = dist_config(ns)
    nodes = node_plan(dist)  # several machines: each launcher names the same OUT
    given = _given_out(ns) or (f"runs/{verb}-{dist.rdzv_id}" if nodes else _new_out(verb))
    created = not Path(given).expanduser().exists()
    out = RunDir(_make_out(given, ns).root.resolve())
    if nodes is not None and not nodes.is_host:  # the rendezvous host's launcher holds OUT
        return _launch(ns, verb, dist, out, None)
    try:
        with RunDirLock(out) as lock:  # one run per directory; dropped when this ends
            lock.record_holder()
            return _launch(ns, verb, dist, out, (argv, given))
    except UserError:
        if created:  # refused before anything ran: leave no empty run directory behind
            remove_if_unused(out)
        raise


def _given_out(ns: argparse.Namespace) -> str | None:
    return getattr(ns, "report_dir", None) or ns.out


def _new_out(verb: str) -> str:
    """`runs/run-<time>` (`runs/watch-<time>`), new: a suffix when that name is taken."""
    base = time.strftime(f"runs/{verb}-%Y%m%d-%H%M%S")
    path, n = base, 1
    while os.path.lexists(path):
        path, n = f"{base}-{n}", n + 1
    return path


def _make_out(path: str, ns: argparse.Namespace) -> RunDir:
    """The run directory, created (a UserError naming the flag when it cannot be)."""
    flag = "--report-dir" if getattr(ns, "report_dir", None) else "--out"
    try:
        Path(path).expanduser().mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"`{flag}` `{path}` cannot be created ({exc.strerror}). Choose a "
                        f"directory you can write to.") from None
    return prepare_out_dir(path)


def _run_env(ns: argparse.Namespace, out: RunDir) -> dict[str, str]:
    """What every rank finds in its environment (set by the launcher, or by the rank
    itself under another launcher): the watchdog's settings, and the run directory."""
    env = {protocol.HANG_TIMEOUT: f"{ns.hang_timeout_s:g}",
           protocol.HANG_REPORT_DIR: str(out.root), protocol.RUN_DIR: str(out.root)}
    if ns.debug_collectives:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    return env


# --- the launcher ------------------------------------------------------------------------

def _launch(ns: argparse.Namespace, verb: str, dist, out: RunDir,
            owner: tuple[list[str], str] | None) -> int:
    """Start the ranks (`python -m phalanx.hang SCRIPT ARGS` each). `owner`: this verb's
    argv and the `--out` to name in the resume command, when this launcher holds the run
    directory (None: another machine's launcher does) and records the run."""
    from phalanx.launch.agent import default_nproc, launch_or_work

    env = _run_env(ns, out)
    if not dist.tee_ranks:
        env[protocol.RANK_LOGS] = str(out.logs)
    logs = "" if dist.tee_ranks else "the ranks' logs (logs/rank-R.log), "
    print(f"phalanx: {verb}: {logs}metrics, events, the report and any hang report go to "
          f"{out.root}/", file=sys.stderr, flush=True)
    command = ["-m", "phalanx.hang", ns.script, *ns.args]
    if owner is None:
        return launch_or_work(dist, command, None, env=env)
    ranks = dist.nproc_per_node or default_nproc()
    started = f"started {shlex.join([ns.script, *ns.args])} on {ranks} rank(s)"
    try:
        with recorded(out, started):
            launch_or_work(dist, command, None, env=env,
                           on_failure=restarts_said(out, dist.max_restarts))
    except Interrupted as exc:  # the ranks stopped (a script's run.save committed first)
        raise Interrupted(exc.signum, stopped_line(exc.signum, out, resume_command(
            owner[0], ns, owner[1]))) from None
    print(f"phalanx: {verb}: done; the run on one page: {out.report}", file=sys.stderr,
          flush=True)
    return 0


def resume_command(argv: list[str], ns: argparse.Namespace, out: str) -> str:
    """`phalanx run --out OUT [flags] SCRIPT ARGS`: this run's command line, continued in
    the same run directory (`--out`/`--report-dir` replaced; the script's own arguments
    kept as they are)."""
    at = len(argv) - len(ns.args) - 1  # where SCRIPT is: flags before, its arguments after
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
    kept = (f": checkpoint {latest.name} is committed" if latest is not None
            and latest.is_dir() else "")
    name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
    return f"stopped by {name}{kept}. Resume with: {command}"


# --- a rank ------------------------------------------------------------------------------

def _worker_out(ns: argparse.Namespace, verb: str) -> RunDir:
    """A rank's run directory under torchrun / srun: `--out`, else a name every rank of
    the job agrees on (`_job_out`)."""
    return RunDir(_make_out(_given_out(ns) or _job_out(verb), ns).root.resolve())


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


def _work(ns: argparse.Namespace, out: RunDir) -> int:
    """One rank under torchrun / srun: run the script; global rank 0 also holds the run
    directory and records the run (start or restart, its end), as Phalanx's own launcher
    does otherwise."""
    from phalanx.hang.__main__ import run_script

    watch = ns.hang_timeout_s > 0
    if _global_rank() != "0":
        run_script(ns.script, ns.args, watch)
        return 0
    restarted = restart_note()  # this launcher's restarts (torchrun --max-restarts)
    if restarted:
        print(f"phalanx: {restarted}", file=sys.stderr, flush=True)
    with RunDirLock(out) as lock:
        lock.record_holder()
        if restarted:
            record_event(out, "restart", step_now(out, logged=False), restarted)
        with recorded(out, None if restarted else
                      f"started {shlex.join([ns.script, *ns.args])}"):
            run_script(ns.script, ns.args, watch)
    return 0
