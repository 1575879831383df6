"""The `phalanx` command and `python -m phalanx`: a Ctrl-C at any moment — while Phalanx
and torch are still being imported, too — ends in one line (exit 130), never a
traceback. Workers of Phalanx's launcher stay silent: the launcher says it once."""

from __future__ import annotations

import os
import sys


def main() -> int:
    try:
        from phalanx.cli import main as cli_main

        return cli_main()
    except KeyboardInterrupt:
        return interrupted()


def interrupted() -> int:
    if not os.environ.get("PHALANX_LAUNCHED"):
        try:
            print("phalanx: interrupted", file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr is gone: the exit code says it
            pass
    return 130
