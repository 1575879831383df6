"""`phalanx slurm [train options] [--nodes N] [--time T] ... [--submit]`: an sbatch
script a person can read and edit, running `srun phalanx train` (each task one rank).
`phalanx slurm [run options] [--nodes N] ... run SCRIPT [ARGS...]` runs the user's script
instead: `srun phalanx run --out OUT SCRIPT ARGS` (`cluster_job`); SCRIPT must be a file
here (the nodes are taken to share this filesystem, as they share OUT), and its absolute
path is written, so the job runs the file checked here wherever sbatch is started.

Preemption and time limits: the script asks SLURM for a warning signal (`--signal=USR1@S`,
sent to every task, not only the batch shell as `B:` would). On it every rank finishes
its step, they agree at the step boundary (one small all-reduce), a checkpoint is
committed and the tasks exit with 138 (128 + SIGUSR1); the script then requeues the job
(`scontrol requeue`) and the requeued job resumes from that checkpoint. One requeue per
signal; any other failure is not requeued. Under `phalanx run` the script's `run.save`
is where a stop commits, and `phalanx run` exits 138 after it: the same requeue.

Every value is checked before it is written (`sbatch_values`): a value in a `#SBATCH`
line cannot hold a line break (the rest of it would run as a command, and sbatch would
ignore every directive after it), job and partition names are limited to the characters
SLURM's own names use, and the run directory is quoted as sbatch reads quotes. The
command line in the body is shell-quoted (`shlex.join`), one word per argument.

Rendering writes nothing but the file asked for (`--script`; without it, stdout only):
OUT is the cluster's path, created where the job is submitted (`--submit` does, as sbatch
needs it for the job's output). The job runs in the directory `phalanx slurm` ran in
(`--chdir`), so a relative path in the command means what it meant here.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from phalanx.checkpoint.rundir import prepare_out_dir
from phalanx.cli.cluster_job import (
    Job,
    add_job_argument,
    check_value,
    job_of,
    layout_note,
    show,
)
from phalanx.cluster.lifecycle import exit_code
from phalanx.config.flags import add_config_flags, count, resolve
from phalanx.errors import UserError
from phalanx.paths import atomic_write, kind, require_file

SUMMARY = ("Render (or submit) an sbatch script that runs `phalanx train` (or, with `run "
           "SCRIPT`, your script under `phalanx run`) under srun.")
REQUEUE_CODE = exit_code(signal.SIGUSR1)  # 138
CPUS_PER_TASK = 4  # without --cpus-per-task or --threads-per-rank (SLURM's default is 1)
_TIME = re.compile(r"(\d+-)?\d{1,2}(:\d{2}){0,2}|\d+")  # fullmatch: no trailing newline
_JOB_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
_PARTITIONS = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
_PLAIN = re.compile(r"[A-Za-z0-9_./@+,=:%-]+")  # written as is in a #SBATCH line
# a line break ends the directive (the rest runs as a command); sbatch splits a job into
# components at "packjob"/"hetjob" anywhere in a #SBATCH line (any case); SLURM's file
# pattern reads a backslash as "expand no %j"
_UNCARRIED = re.compile(r"[\x00-\x1f\x7f\\]|packjob|hetjob", re.IGNORECASE)
_COMPONENT = re.compile(r"packjob|hetjob", re.IGNORECASE)
# flag → takes a value (the rest of the command line goes to `phalanx train` / `run`)
OWN_FLAGS = {"--nodes": True, "--ntasks-per-node": True, "--gpus-per-node": True,
             "--cpus-per-task": True, "--time": True, "--partition": True,
             "--signal-s": True, "--job-name": True, "--script": True, "--submit": False}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)
    g = parser.add_argument_group("slurm")
    g.add_argument("--nodes", type=count(1, 100000), default=1, help="nodes (default: 1)")
    g.add_argument("--ntasks-per-node", type=count(1, 4096), default=None,
                   help="ranks per node (default: --gpus-per-node, else --nproc-per-node, "
                        "else 1)")
    g.add_argument("--gpus-per-node", type=count(0, 64), default=0,
                   help="GPUs per node to request (default: 0)")
    g.add_argument("--cpus-per-task", type=count(1, 4096), default=None,
                   help="CPU cores per rank (default: --threads-per-rank when given, else "
                        f"{CPUS_PER_TASK}; SLURM's own default would be 1)")
    g.add_argument("--time", default="01:00:00",
                   help="time limit, as sbatch takes it: [D-]HH:MM:SS, MM (default: 01:00:00)")
    g.add_argument("--partition", default=None, help="partition (default: the cluster's)")
    g.add_argument("--job-name", default="phalanx", help="job name (default: phalanx)")
    g.add_argument("--signal-s", type=count(10, 86400), default=90,
                   help="seconds before the time limit at which SLURM warns the ranks "
                        "(SIGUSR1): they checkpoint, exit and the job requeues (default: 90)")
    g.add_argument("--script", default=None, metavar="FILE",
                   help="also write the sbatch script to FILE (default: stdout only; with "
                        "--submit, OUT/phalanx.sbatch)")
    g.add_argument("--submit", action="store_true",
                   help="create OUT, submit the script with sbatch and print the job id")
    add_job_argument(parser, "SCRIPT must be a file here, on storage the nodes share: its "
                     "absolute path is written into the job.")


def sbatch_values(ns: argparse.Namespace, out: Path, cwd: Path) -> dict[str, str]:
    """The strings that go into `#SBATCH` lines, checked: UserError for one that the
    script cannot carry. (The numbers are argparse's `count`s.)"""
    check_value(_TIME, "--time", ns.time, "a SLURM time; use [D-]HH:MM:SS, e.g. "
                "`--time 02:00:00` or `--time 1-00:00:00`.")
    check_value(_JOB_NAME, "--job-name", ns.job_name, "a job name this script can carry: use "
                "letters, digits and `_.+-`, at most 128 characters, no spaces or line "
                "breaks, e.g. `--job-name gpt-run-2`.")
    if ns.partition is not None:
        check_value(_PARTITIONS, "--partition", ns.partition, "a SLURM partition name: "
                    "letters, digits and `_.-`, several separated by commas, e.g. "
                    "`--partition gpu` or `--partition gpu,gpu-long`.")
    for flag, value in (("--job-name", ns.job_name), ("--partition", ns.partition or "")):
        if found := _COMPONENT.search(value):
            raise UserError(f"`{flag} {show(value)}` holds `{found.group()}`"
                            f", which sbatch reads in a `#SBATCH` line as the start of another "
                            f"job component; choose a name without it.")
    return {"time": ns.time, "job_name": ns.job_name, "partition": ns.partition or "",
            "output": _output_pattern(out),
            "chdir": _carried(cwd, "--chdir", "the directory `phalanx slurm` runs in",
                              "run it from a directory without it")}


def _output_pattern(out: str | Path) -> str:
    """`--output` for OUT/slurm-%j.out as sbatch reads it: `%` doubled (SLURM's file
    pattern), quoted when it holds anything but plain characters."""
    text = _carried(out, "--output", f"`--out {show(str(out))}`",
                    "choose a run directory without it")
    return _quoted(text.replace("%", "%%") + "/slurm-%j.out")


def _carried(path: str | Path, directive: str, what: str, fix: str) -> str:
    """`path` as text, or UserError when a `#SBATCH` line cannot carry it."""
    text = str(path)
    if found := _UNCARRIED.search(text):
        raise UserError(f"{what} holds `{show(found.group())}`, which an sbatch script cannot "
                        f"carry in its `#SBATCH {directive}` line: {fix}.")
    return text


def _quoted(text: str) -> str:
    """`text` as sbatch reads it in a `#SBATCH` line: as is when plain, else quoted."""
    return text if _PLAIN.fullmatch(text) else '"' + text.replace('"', '\\"') + '"'


def render(ns: argparse.Namespace, cfg, job: Job, out: Path, cwd: Path) -> str:
    """The sbatch script: `srun phalanx train ...`, or `srun phalanx run ... SCRIPT ARGS`
    for a Job with a script; the same directives and requeue either way."""
    # OUT is made absolute (and comes last); SLURM sets the ranks
    command = job.command(sys.executable, {**OWN_FLAGS, "--out": True,
                                           "--nproc-per-node": True}, ["--out", str(out)])
    stopped = "stopped by the warning signal with a checkpoint committed" \
        if job.script is None else \
        "your script stopped on the warning signal (its `run.save` committed)"
    lines = ["#!/bin/bash",
             "# Rendered by `phalanx slurm`; edit freely, then `sbatch` this file.",
             *_directives(ns, cfg, out, cwd), "",
             "# every task is one rank (phalanx reads SLURM_PROCID/LOCALID/STEP_NUM_TASKS and",
             "# meets on the first host). Not --kill-on-bad-exit: on the warning signal every",
             "# rank exits 138 after the checkpoint, and killing the slower ones would turn",
             "# that code into a failure; a rank that fails makes the others fail in turn.",
             f"srun {shlex.join(command)}", "code=$?",
             f"if [ \"$code\" -eq {REQUEUE_CODE} ]; then",
             f"  # {stopped}: back in the queue",
             "  if command -v scontrol >/dev/null; then",
             "    scontrol requeue \"$SLURM_JOB_ID\"",
             "  else",
             "    echo \"phalanx: scontrol is not available here (a container?): cannot "
             "requeue; submit this script again to resume\" >&2",
             "  fi", "fi", "exit \"$code\"", ""]
    return "\n".join(lines)


def _directives(ns: argparse.Namespace, cfg, out: Path, cwd: Path) -> list[str]:
    """The `#SBATCH` lines, every value checked (`sbatch_values`)."""
    v = sbatch_values(ns, out, cwd)
    tasks = ns.ntasks_per_node or ns.gpus_per_node or cfg.dist.nproc_per_node or 1
    cpus = ns.cpus_per_task or cfg.dist.threads_per_rank or CPUS_PER_TASK
    lines = [f"#SBATCH --job-name={v['job_name']}", f"#SBATCH --nodes={ns.nodes}",
             f"#SBATCH --ntasks-per-node={tasks}", f"#SBATCH --cpus-per-task={cpus}",
             f"#SBATCH --time={v['time']}"]
    lines += [f"#SBATCH --gpus-per-node={ns.gpus_per_node}"] if ns.gpus_per_node else []
    lines += [f"#SBATCH --partition={v['partition']}"] if v["partition"] else []
    return lines + [f"#SBATCH --signal=USR1@{ns.signal_s}", "#SBATCH --requeue",
                    "#SBATCH --open-mode=append", f"#SBATCH --output={v['output']}",
                    "# relative paths below are read from where `phalanx slurm` ran",
                    f"#SBATCH --chdir={_quoted(v['chdir'])}"]


def _job(ns: argparse.Namespace, argv: list[str]) -> Job:
    """The Job of this command line; a script must be a file here (the nodes share this
    filesystem, as they share OUT) and is written as its absolute path."""
    job = job_of(ns, argv, "slurm")
    if job.script is None:
        return job
    found = require_file(job.script, "the script (`run SCRIPT`)",
                         "Give a file on storage the nodes share; its absolute path goes "
                         "into the job.")
    return Job(job.flags, str(found.absolute()), job.args)


def run_slurm(ns: argparse.Namespace, argv: list[str]) -> int:
    job = _job(ns, argv)
    cfg = resolve(ns)
    _output_pattern(cfg.train.out)  # as given (a NUL byte stops `resolve`), then resolved
    out = Path(cfg.train.out).expanduser().resolve()
    spread = layout_note(cfg, ns.nodes, ns.ntasks_per_node or ns.gpus_per_node
                         or cfg.dist.nproc_per_node or 1)
    text = render(ns, cfg, job, out, Path.cwd())  # every check before anything is written
    if ns.submit:
        if spread:
            print(f"# note: {spread}", file=sys.stderr)
        return _submit(cfg, text, Path(ns.script or out / "phalanx.sbatch").expanduser(), out)
    if ns.script:
        script = Path(ns.script).expanduser()
        _write(script, text)
        note = f"written to {script}; submit on the cluster with: mkdir -p " \
               f"{shlex.quote(str(out))} && sbatch {shlex.quote(str(script))}"
    else:
        note = f"save it (or give --script FILE), then on the cluster: mkdir -p " \
               f"{shlex.quote(str(out))} && sbatch FILE"
    print(text, end="", flush=True)  # all of it before the notes, in a shared stream
    for said in filter(None, (spread and f"note: {spread}", note)):
        print(f"# {said}", file=sys.stderr)
    return 0


def _writable(script: Path) -> None:
    if kind(script) not in ("missing", "a regular file"):
        raise UserError(f"cannot write `{script}` (`--script`): it is {kind(script)}.")


def _write(script: Path, text: str) -> None:
    """The script at `script` (its folder must exist: nothing else is created)."""
    _writable(script)
    try:
        atomic_write(script, text)  # a link planted there is replaced, not followed
    except OSError as exc:
        raise UserError(f"cannot write `{script}` (`--script`): {exc.strerror}.") from None


def _submit(cfg, text: str, script: Path, out: Path) -> int:
    """On the cluster: OUT created (SLURM opens OUT/slurm-%j.out before the job starts),
    the script written, submitted with sbatch."""
    if shutil.which("sbatch") is None:
        raise UserError("`--submit` needs `sbatch`, which is not on PATH here: submit from a "
                        "SLURM login node, or render without --submit.")
    _writable(script)  # before OUT is created
    prepare_out_dir(cfg.train.out)
    _write(script, text)
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise UserError(f"sbatch refused `{script}`: {said[-1] if said else 'no reason given'}")
    job_id = done.stdout.strip().split(";")[0]
    print(f"submitted job {job_id}: {script}; output in {out}/slurm-{job_id}.out")
    return 0
