"""`phalanx watch [--nproc-per-node N] [--hang-timeout-s S] [--debug-collectives] SCRIPT
[ARGS...]`: run a user's own training script on N local ranks through torch's elastic
agent (as torchrun would), with the hang watchdog and, optionally, torch's collective
verification. The same is available under torchrun itself:
`torchrun --nproc-per-node N -m phalanx.hang SCRIPT ARGS`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from phalanx.cluster import protocol
from phalanx.config.flags import add_launch_flags, dist_config, seconds
from phalanx.errors import UserError
from phalanx.paths import require_file

SUMMARY = ("Run your own training script on N local ranks with the hang watchdog "
           "(and optional collective verification).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_flags(parser, extra=("tee_ranks",))
    parser.add_argument("--hang-timeout-s", type=seconds, default=300.0, metavar="S",
                        help="report and stop when no rank progresses for S seconds "
                             "(default: 300)")
    parser.add_argument("--debug-collectives", action="store_true",
                        help="verify every collective across ranks "
                             "(TORCH_DISTRIBUTED_DEBUG=DETAIL) and explain a mismatch")
    parser.add_argument("--report-dir", default=None, metavar="DIR",
                        help="where hang-report.txt and the ranks' logs (logs/rank-R.log) go "
                             "(default: runs/watch-YYYYmmdd-HHMMSS, a new one per run)")
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


def make_report_dir(given: str | None) -> Path:
    """`--report-dir`, or a new `runs/watch-<time>` (not the current folder itself),
    created; a UserError when it cannot be."""
    path = Path(given or time.strftime("runs/watch-%Y%m%d-%H%M%S")).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"`--report-dir` `{path}` cannot be created ({exc.strerror}). "
                        f"Choose a directory you can write to.") from None
    return path.resolve()


def run_watch(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.launch.agent import launch_or_work

    check_script(ns.script)
    dist = dist_config(ns)
    report_dir = make_report_dir(ns.report_dir)
    env = {protocol.HANG_TIMEOUT: str(ns.hang_timeout_s),
           protocol.HANG_REPORT_DIR: str(report_dir)}
    if ns.debug_collectives:
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if not dist.tee_ranks:
        env[protocol.RANK_LOGS] = str(report_dir / "logs")
    logs = "" if dist.tee_ranks else "the ranks' logs (logs/rank-R.log) and "
    print(f"phalanx: watch: {logs}any hang report go to {report_dir}/", file=sys.stderr,
          flush=True)
    return launch_or_work(dist, ["-m", "phalanx.hang", ns.script, *ns.args], None,
                          env=env)
