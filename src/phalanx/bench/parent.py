"""The launching side of `phalanx bench`: the ranks started once, as `phalanx train`
starts them (phalanx.bench.timed_rank in each), their measurement read back, the report
written (OUT/bench/report.md, results.json, plots and Chrome traces) and printed."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path

from phalanx.bench import markdown as report
from phalanx.bench.peers import PEERS
from phalanx.checkpoint.rundir import prepare_out_dir
from phalanx.cluster import protocol
from phalanx.config.sections import Config
from phalanx.data.corpus import check_data
from phalanx.errors import Interrupted
from phalanx.launch.agent import plan_launch, start_workers
from phalanx.paths import atomic_write, ensure_dir


def parent(cfg: Config, *, repeats: int, steps: int, warmup: int, peers: bool,
           profile: bool, defaults: bool, scaling: bool) -> int:
    """Bench `cfg`'s step (`peers`: beside a plain DDP loop, Accelerate and Fabric) in
    `repeats` timed blocks of `steps` steps after `warmup`; exit code 0."""
    check_data(cfg.data)  # `--data`, `--tokenizer` readable before anything is written
    out = ensure_dir(prepare_out_dir(cfg.train.out) / "bench", "in the run directory")
    plan = plan_launch(cfg.dist)  # as `phalanx train` launches; always workers here
    spec = {"config": cfg.to_dict(), "repeats": repeats, "steps": steps,
            "warmup": warmup, "out": str(out), "threads": plan.threads}
    impls = list(PEERS) if peers else ["phalanx"]
    try:
        res = _phase({**spec, "impls": impls, "profile": profile, "defaults": defaults,
                      "scaling": scaling}, plan, out / "raw.json")
    except Interrupted as exc:  # the workers kept the rounds they completed, if any
        raise Interrupted(exc.signum, _partial(out, exc.signum)) from None
    atomic_write(out / "results.json", json.dumps(res, indent=2))  # a link: replaced
    path = report.write(res, out)
    print(path.read_text())
    print(f"wrote: {', '.join(map(str, [path, out / 'results.json', *report.plots_of(out)]))}")
    return 0


def _partial(out: Path, signum: int) -> str:
    """After Ctrl-C: the report of the complete rounds, if any; what to say."""
    name = signal.Signals(signum).name
    raw = out / "raw.json"
    res = json.loads(raw.read_text()) if raw.is_file() else None
    if not res or not res.get("stopped"):
        return f"stopped by {name} before the first timed round ended: no report."
    atomic_write(out / "results.json", json.dumps(res, indent=2))  # a link: replaced
    path = report.write(res, out)
    return (f"stopped by {name} after {res['repeats']} complete round(s): partial report at "
            f"{path}.")


def _phase(spec: dict, plan, result: Path) -> dict:
    """The ranks started with `spec` (they re-enter `phalanx bench` and find it in
    PHALANX_BENCH_PHASE); rank 0's measurement, read from `result`."""
    result.unlink(missing_ok=True)
    phase = json.dumps({**spec, "result": str(result)})
    env = {**plan.env, protocol.BENCH_PHASE: phase}
    if not plan.env.get(protocol.RANK_LOGS):  # the ranks' output (and torch's profiler
        env[protocol.RANK_LOGS] = str(result.parent / "logs")  # lines): logs
    start_workers(["-m", "phalanx", "bench"], dataclasses.replace(plan, env=env))
    return json.loads(result.read_text())
