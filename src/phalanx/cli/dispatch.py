"""`phalanx VERB ...`: a thin table of verbs → functions. Errors become one line, exit 2."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from phalanx.cli import bench as bench_command
from phalanx.cli import doctor as doctor_command
from phalanx.cli import export as export_command
from phalanx.cli import k8s, verify_resume
from phalanx.cli import lint as lint_command
from phalanx.cli import plan as plan_command
from phalanx.cli import report as report_command
from phalanx.cli import run as run_command
from phalanx.cli import slurm as slurm_script
from phalanx.cli import train as train_command
from phalanx.cli import watch as watch_command
from phalanx.cluster.lifecycle import die_with_agent, interrupted
from phalanx.cluster.protocol import record_for_agent
from phalanx.cluster.ranklogs import log_traceback, quiet_worker
from phalanx.cluster.startup_trace import mark, process_started
from phalanx.errors import DistributedError, Interrupted, UserError, storage_errors
from phalanx.launch.job import handed_job
from phalanx.version import __version__

VERBS = {
    "train": (train_command.add_arguments, train_command.run_train,
              "Train MiniGPT on every local device (default: the embedded corpus)."),
    "run": (run_command.add_arguments, run_command.run_run, run_command.SUMMARY),
    "verify-resume": (verify_resume.add_arguments, verify_resume.run_verify_resume,
                      verify_resume.SUMMARY),
    "lint": (lint_command.add_arguments, lint_command.run_lint, lint_command.SUMMARY),
    "bench": (bench_command.add_arguments, bench_command.run_bench, bench_command.SUMMARY),
    "doctor": (doctor_command.add_arguments, doctor_command.run_doctor, doctor_command.SUMMARY),
    "watch": (watch_command.add_arguments, watch_command.run_watch, watch_command.SUMMARY),
    "plan": (plan_command.add_arguments, plan_command.run_plan, plan_command.SUMMARY),
    "report": (report_command.add_arguments, report_command.run_report,
               report_command.SUMMARY),
    "slurm": (slurm_script.add_arguments, slurm_script.run_slurm, slurm_script.SUMMARY),
    "k8s": (k8s.add_arguments, k8s.run_k8s, k8s.SUMMARY),
    "export": (export_command.add_arguments, export_command.run_export,
               "Write a checkpoint's weights as one .safetensors file plus config.json."),
}


FROM_JOB = {"train": train_command.run_job}  # verbs whose workers start from a job file


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one message and a pointer to --help (exit 2)."""

    verb_parsers: dict[str, argparse.ArgumentParser]  # each verb's, set by build_parser

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nSee `{self.prog} --help` for every option.\n")


def build_parser() -> Parser:
    parser = Parser(  # no abbreviated flags: `--max-step` is a typo, not `--max-steps`
        prog="phalanx", description="PyTorch data-parallel training, correct by construction.",
        allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"phalanx {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    parser.verb_parsers = {}
    for name, (add_arguments, _, help_text) in VERBS.items():
        sub = verbs.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)
        add_arguments(sub)
        parser.verb_parsers[name] = sub
    return parser


def parse(parser: Parser, argv: list[str]) -> argparse.Namespace:
    """Parse; an unknown flag is reported by the verb's parser (pointing at `phalanx VERB
    --help`, where the flags it takes are), not the top-level one."""
    ns, extras = parser.parse_known_args(argv)
    if extras:
        parser.verb_parsers[ns.verb].error(
            f"unrecognized arguments: {' '.join(extras)}")
    return ns


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt as exc:  # before the verb runs (parsing, start-up)
        return interrupted(exc)
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    mark("python started", at=process_started)
    mark("phalanx imported")
    die_with_agent()
    quiet_worker()  # under Phalanx's launcher: this rank's output goes to its log
    try:
        with storage_errors():  # a full or read-only disk is the user's to fix (exit 2)
            return _run_verb(argv)
    except UserError as exc:
        left_uncaught(exc)
        if not record_for_agent(exc):  # under Phalanx's launcher, the launcher says it once
            print(f"phalanx: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except DistributedError as exc:
        left_uncaught(exc)
        log_traceback(exc)  # the cause's traceback, for the log the launcher points to
        if not record_for_agent(exc):  # under Phalanx's launcher, the launcher says it once
            print(f"phalanx: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except Interrupted as exc:
        print(f"phalanx: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C outside the training loop (phalanx.cli.entry)
        return interrupted(exc)
    except BaseException as exc:  # a bug, or a failure in torch: keep the traceback
        left_uncaught(exc)
        record_for_agent(exc)  # (the launcher shows it once; the rank's log holds it)
        if isinstance(exc, Exception) and log_traceback(exc):
            return 1
        raise


def _run_verb(argv: list[str]) -> int:
    """The verb: a worker of Phalanx's launcher starts from the job it was handed (the
    command line was parsed once, by the launcher); anything else parses ARGV."""
    job = handed_job()
    if job is not None and argv[:1] == [job.verb] and job.verb in FROM_JOB:
        return FROM_JOB[job.verb](job)
    ns = parse(build_parser(), argv)
    mark("command line parsed")
    return VERBS[ns.verb][1](ns, argv[argv.index(ns.verb) + 1:])


def left_uncaught(exc: BaseException) -> None:
    """Mark `exc` as the error that ended the program, where Python marks an uncaught one
    (`sys.last_value`): a script's `Run` (phalanx.init) then shuts down as failed at exit,
    without the barrier its peers would never join."""
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return  # `sys.exit(main())` of a script that succeeded
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
