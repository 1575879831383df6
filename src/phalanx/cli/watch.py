"""`phalanx watch`: the older name of `phalanx run` (phalanx.cli.run), kept working with
its flags: `--report-dir DIR` is `--out DIR`, the default run directory is a new
`runs/watch-YYYYmmdd-HHMMSS`, and `--hang-timeout-s` must be > 0 (the watchdog is the
point). Everything else — quiet ranks, the lock, events, the report — is `phalanx run`'s.
Under torchrun itself: `torchrun --nproc-per-node N -m phalanx.hang SCRIPT ARGS`.
"""

from __future__ import annotations

import argparse

from phalanx.cli import run as run_command

SUMMARY = ("The same as `phalanx run` (its older name; --report-dir is --out): your own "
           "script on N ranks with the hang watchdog.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    run_command.add_arguments(parser, watch=True)


def run_watch(ns: argparse.Namespace, argv: list[str]) -> int:
    return run_command.run_verb(ns, argv, "watch")
