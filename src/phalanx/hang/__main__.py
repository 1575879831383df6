"""`python -m phalanx.hang SCRIPT [ARGS...]`: run an unmodified training script with the
hang watchdog, e.g. `torchrun --nproc-per-node 2 -m phalanx.hang train.py`.

The watchdog starts as soon as the script's `init_process_group` returns. Settings come
from the environment: PHALANX_HANG_TIMEOUT (seconds, default 300) and
PHALANX_HANG_REPORT_DIR (default: the current directory).
"""

from __future__ import annotations

import os
import runpy
import sys

from phalanx.cluster import protocol


def _watch_after_init() -> None:
    import torch.distributed as dist

    from phalanx.hang.watchdog import start_watchdog

    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        start_watchdog(dist.get_rank(), dist.get_world_size(), hang_timeout(),
                       os.environ.get(protocol.HANG_REPORT_DIR))
        os.environ[protocol.WATCHED] = "1"  # phalanx.init in the script: no second watchdog
        return result

    dist.init_process_group = init_process_group


def hang_timeout() -> float:
    from phalanx.errors import UserError
    from phalanx.hang.watchdog import timeout_from_env

    try:
        value = timeout_from_env(default="300")
        if value == 0:
            raise UserError("PHALANX_HANG_TIMEOUT is 0; under phalanx.hang expected > 0.")
    except UserError as exc:
        print(f"phalanx: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return value


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m phalanx.hang SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    script = sys.argv[1]
    if not os.path.isfile(script):
        print(f"phalanx: error: `{script}` is not a file.", file=sys.stderr)
        raise SystemExit(2)
    hang_timeout()
    from phalanx.cluster.lifecycle import die_with_agent

    die_with_agent()
    from phalanx.cluster.ranklogs import log_traceback, quiet_worker

    quiet_worker()  # under Phalanx's launcher: this rank's output goes to its log
    _watch_after_init()
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    from phalanx.cluster.protocol import record_for_agent
    from phalanx.hang.mismatch import explain

    try:
        runpy.run_path(script, run_name="__main__")
    except Exception as exc:  # for the launcher's account: where each rank failed
        plain = explain(exc)
        if plain is None:
            record_for_agent(exc)
            if log_traceback(exc):  # the launcher shows it once
                raise SystemExit(1) from None
            raise
        log_traceback(exc)
        if not record_for_agent(plain):
            print(f"phalanx: error: {plain}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
