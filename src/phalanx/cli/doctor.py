"""`phalanx doctor [--nproc-per-node N] [--json] [--model pkg.module:factory]`: check the
environment, the process group, communication, speed and a model, with real collectives
in a real group, launched the same way as `phalanx train`. Rank 0 prints one table (or
JSON); exit 1 when any check fails."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from phalanx.cluster import protocol
from phalanx.config.flags import add_launch_flags, dist_config, seconds
from phalanx.doctor.rank_checks import worker
from phalanx.strategies import SPECS, default_name

SUMMARY = ("Check environment, process group, collectives, bandwidth, stragglers and a "
           "model across ranks.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_flags(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--model", default=None, metavar="MODULE:FACTORY",
                        help="your model: a function returning a module or (module, example "
                             "input); default: the built-in MiniGPT")
    parser.add_argument("--init-timeout-s", type=seconds, default=60.0, metavar="S",
                        help="how long ranks wait for each other to join (default: 60)")
    parser.add_argument("--strategy", choices=[n for n in SPECS if n != default_name(1)],
                        default=default_name(2),
                        help="how the model checks wrap --model (default: %(default)s)")


def run_doctor(ns: argparse.Namespace, argv: list[str]) -> int:
    """Launched as `phalanx train` is (phalanx.launch.agent); rank 0's verdict comes back in a
    file, as the workers exit 0 so that the agent does not restart them."""
    from phalanx.launch.agent import launch_or_work

    private = tempfile.mkdtemp(prefix="phalanx-doctor-")  # 0700: no name another user
    path = os.path.join(private, "verdict")  # of the machine could plant a link at
    options = {"model": ns.model, "strategy": ns.strategy,
               "init_timeout_s": ns.init_timeout_s, "as_json": ns.json}
    try:
        code = launch_or_work(dist_config(ns), ["-m", "phalanx", "doctor", *argv],
                              lambda _threads: worker(**options),
                              env={protocol.DOCTOR_RESULT: path})
        if not os.path.exists(path):  # under another launcher
            return code
        with open(path) as f:
            return int(f.read() or 0)
    finally:
        shutil.rmtree(private, ignore_errors=True)
