"""`phalanx run [launch flags] [--out DIR] [--hang-timeout-s S] [--debug-collectives]
[--tee-ranks] SCRIPT [ARGS...]`: your own training script on N ranks, the twin of
`phalanx train` on the same launch path (`launch_or_work`: torch's elastic agent, or —
under torchrun / srun — this process is one rank).

The script gets a run directory (`--out`, default a new `runs/run-<time>`; locked for
the run's life, so a second run on it is refused), quiet ranks (each rank's output in
`OUT/logs/rank-R.log`, rank 0's also on the console), the hang watchdog (`--hang-timeout-s`,
300 s; its report in OUT), `PHALANX_RUN_DIR` = OUT (phalanx.init's `run.out`: metrics,
checkpoints, stop at the next `run.save`), restarts (`--max-restarts`), the strategy
`phalanx.init` builds (`--strategy`; a script naming another is refused), `OUT/events.jsonl`
(start, restarts, the end, a failure or a stop) and `OUT/report.html` at the end.

Each rank runs `python -m phalanx.hang SCRIPT ARGS` (SCRIPT as `__main__`, the watchdog
after its `init_process_group`; phalanx.hang.__main__), told the rest in its environment.
Under torchrun / srun `phalanx run SCRIPT ARGS` is that rank itself, and global rank 0
holds the run directory. `phalanx watch` is this verb under its older name (`--report-dir`
for `--out`, default `runs/watch-<time>`).
"""

from __future__ import annotations

import argparse

from phalanx.config.flags import add_launch_flags, dist_config, seconds
from phalanx.errors import UserError
from phalanx.paths import require_file

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
    add_launch_flags(parser, extra=("tee_ranks", "max_restarts", "threads_per_rank",
                                     "strategy", "straggler_every"))
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
    parser.add_argument("--tracker", default="", metavar="NAMES",
                        help="experiment trackers `run.log` also writes to, comma-separated: "
                             "wandb (honours WANDB_MODE, WANDB_DIR, WANDB_PROJECT), mlflow "
                             "(MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME); the "
                             "script's phalanx.init(trackers=...) overrides it")
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
    """`phalanx VERB ARGV` (run or watch): the script checked, the run handed to
    launch.script_run."""
    from phalanx.launch.script_run import ScriptRun, run_script_job

    check_script(ns.script)
    if ns.tracker:  # the ranks' phalanx.init reads it (they inherit this environment)
        import os

        from phalanx.cluster import protocol
        from phalanx.config.fields import tracker_list

        os.environ[protocol.TRACKERS] = ",".join(tracker_list(ns.tracker))
    report_dir = getattr(ns, "report_dir", None)
    return run_script_job(ScriptRun(
        verb, ns.script, tuple(ns.args), dist_config(ns), report_dir or ns.out,
        "--report-dir" if report_dir else "--out", ns.hang_timeout_s, ns.debug_collectives,
        tuple(argv)))
