"""`phalanx bench [train options] [--peers] [--defaults] [--scaling] [--profile]`: measured
side by side in one launch; writes OUT/bench/report.md, results.json, plots and Chrome
traces."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
from pathlib import Path

from phalanx.checkpoint.rundir import prepare_out_dir
from phalanx.cluster import protocol
from phalanx.cluster.env import detect_launch_env
from phalanx.cluster.protocol import under_launcher
from phalanx.config.flags import TRAINING_RUN_ONLY, add_config_flags, count, resolve
from phalanx.config.sections import from_dict
from phalanx.config.strategy import choose
from phalanx.errors import Interrupted, UserError
from phalanx.strategies import build, choose_for_script

SUMMARY = ("Measure the training step: Phalanx vs a plain DDP loop, Accelerate and Fabric; "
           "where the time goes; scaling.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench's own flags first; then the training options that shape the timed step."""
    group = parser.add_argument_group("bench options")
    group.add_argument("--peers", action="store_true",
                       help="also time a plain DDP loop, Accelerate and Lightning Fabric "
                            "(`pip install phalanx[bench]`)")
    group.add_argument("--scaling", action="store_true",
                       help="weak and strong scaling, 1 … N ranks")
    group.add_argument("--profile", action="store_true",
                       help="torch.profiler step breakdown, exposed communication, traces")
    group.add_argument("--defaults", action="store_true",
                       help="time Phalanx's step with each of its performance defaults put "
                            "back to torch's (static_graph, gradient_as_bucket_view, bucket "
                            "sizes, fused AdamW)")
    group.add_argument("--repeats", type=count(1, 10000), default=5, metavar="N",
                       help="timed blocks each (1-10000; default: 5)")
    group.add_argument("--steps", type=count(1, 10000), default=10, metavar="N",
                       help="steps per block (1-10000; default: 10)")
    group.add_argument("--warmup", type=count(0, 10000), default=3, metavar="N",
                       help="untimed steps first (0-10000; default: 3)")
    add_config_flags(parser, hide=TRAINING_RUN_ONLY)


def run_bench(ns: argparse.Namespace, argv: list[str]) -> int:

    if under_launcher():
        return worker(json.loads(os.environ[protocol.BENCH_PHASE]))
    from phalanx.bench import peers as peer_impls

    missing = [p for p in ("accelerate", "fabric") if not peer_impls.available(p)]
    if ns.peers and missing:
        raise UserError(f"`--peers` needs {', '.join(peer_impls.PACKAGES[m] for m in missing)}: "
                        f"pip install -c constraints.txt -e \".[bench]\"")
    return parent(ns)


def parent(ns: argparse.Namespace) -> int:
    from phalanx.bench import report
    from phalanx.bench.peers import PEERS
    from phalanx.data.corpus import source_files
    from phalanx.launch.agent import plan_launch

    cfg = resolve(ns)
    source_files(cfg.data.path)  # `--data` is readable before anything is written
    out = prepare_out_dir(cfg.train.out) / "bench"
    out.mkdir(parents=True, exist_ok=True)
    plan = plan_launch(cfg.dist)  # as `phalanx train` launches; always workers here
    spec = {"config": cfg.to_dict(), "repeats": ns.repeats, "steps": ns.steps,
            "warmup": ns.warmup, "out": str(out), "threads": plan.threads}
    impls = list(PEERS) if ns.peers else ["phalanx"]
    try:
        res = _phase({**spec, "impls": impls, "profile": ns.profile, "defaults": ns.defaults,
                      "scaling": ns.scaling}, plan, out / "raw.json")
    except Interrupted as exc:  # the workers kept the rounds they completed, if any
        raise Interrupted(exc.signum, _partial(out, exc.signum)) from None
    (out / "results.json").write_text(json.dumps(res, indent=2))
    path = report.write(res, out)
    print(path.read_text())
    print(f"wrote: {', '.join(map(str, [path, out / 'results.json', *report.plots_of(out)]))}")
    return 0


def _partial(out: Path, signum: int) -> str:
    """After Ctrl-C: the report of the complete rounds, if any; what to say."""
    import signal

    from phalanx.bench import report

    name = signal.Signals(signum).name
    raw = out / "raw.json"
    res = json.loads(raw.read_text()) if raw.is_file() else None
    if not res or not res.get("stopped"):
        return f"stopped by {name} before the first timed round ended: no report."
    (out / "results.json").write_text(json.dumps(res, indent=2))
    path = report.write(res, out)
    return (f"stopped by {name} after {res['repeats']} complete round(s): partial report at "
            f"{path}.")


def _phase(spec: dict, plan, result: Path) -> dict:
    from phalanx.cluster.ranklogs import LOGS_ENV
    from phalanx.launch.agent import start_workers

    result.unlink(missing_ok=True)
    phase = json.dumps({**spec, "result": str(result)})
    env = {**plan.env, protocol.BENCH_PHASE: phase}
    if not plan.env.get(LOGS_ENV):  # the ranks' output (and torch's profiler lines): logs
        env[LOGS_ENV] = str(result.parent / "logs")
    start_workers(["-m", "phalanx", "bench"], dataclasses.replace(plan, env=env))
    return json.loads(result.read_text())


def worker(spec: dict) -> int:
    import phalanx
    from phalanx.bench import defaults, peers, runner, scaling
    from phalanx.data.corpus import prepare

    cfg = from_dict(spec["config"])
    tokens = prepare(cfg.data.path, cfg.data.cache_dir, cfg.data.val_fraction).load("train")
    choice = choose(cfg.dist, detect_launch_env().world_size, cfg.train.grad_accum)
    run = phalanx.init(cfg.train.seed, backend=cfg.dist.backend, threads=spec["threads"],
                       strategy=choice)
    with run:
        steps = {name: peers.SETUPS[name](cfg, tokens, run) for name in spec["impls"]}
        steps.update(baseline_step(cfg, tokens, run))
        variants = defaults.setups(cfg, tokens, run) if spec["defaults"] else {}
        names, variant_info = list(steps), defaults.describe(variants)
        times: dict = {}
        prof = sweep = None
        try:
            times = runner.compare(run, {**steps, **variants}, spec["repeats"], spec["steps"],
                                   spec["warmup"])
            prof = runner.breakdown(run, steps["phalanx"], Path(spec["out"]), spec["steps"],
                                    spec["repeats"]) if spec["profile"] else None
            del steps, variants  # free their models before the sweep builds its own
            sweep = scaling.sweep(cfg, tokens, run, spec["repeats"], spec["steps"],
                                  spec["warmup"]) if spec["scaling"] else None
        except (runner.Stopped, KeyboardInterrupt) as stop:  # Ctrl-C: keep what is complete
            if isinstance(stop, runner.Stopped):
                times = stop.times
            if run.is_main and times.get("phalanx"):
                _write_result(spec, cfg, run, times, names, variant_info, None, None, True)
            raise SystemExit(130) from None  # no collective after an interrupted one
        if run.is_main:
            _write_result(spec, cfg, run, times, names, variant_info, prof, sweep, False)
    return 0


def _write_result(spec, cfg, run, times, names, variant_info, prof, sweep,
                  stopped: bool) -> None:
    """Rank 0: the measurement as JSON at `spec["result"]` (`stopped`: Ctrl-C ended it
    early; only the complete rounds are in `times`)."""
    import torch

    from phalanx.bench import flops, peers
    from phalanx.models import build_model

    model = build_model(cfg)
    n_params, m = flops.matmul_params(model), cfg.model
    per_token = flops.flops_per_token(n_params, m.n_layer, m.n_embd, m.block_size)
    tokens_per_step = cfg.tokens_per_step(run.world_size)
    device = torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "CPU"
    tps = tokens_per_step / statistics.median(times["phalanx"])
    res = {"config": spec["config"], "world_size": run.world_size, "threads": run.threads,
           "strategy": run.strategy.name, "device_name": device, "versions": peers.versions(),
           "repeats": len(times["phalanx"]), "repeats_asked": spec["repeats"],
           "steps": spec["steps"],
           "tokens_per_step": tokens_per_step, "matmul_params": n_params,
           "flops_per_token": per_token, "peak_flops": flops.peak_flops(device),
           "mfu": flops.mfu(tps, per_token, device, run.world_size),
           "peers": {name: times[name] for name in names}, "profile": prof, "scaling": sweep,
           "defaults": [{**d, "times": times[d["label"]]} for d in variant_info],
           "stopped": stopped}
    Path(spec["result"]).write_text(json.dumps(res))


def baseline_step(cfg, tokens, run) -> dict:
    """With a strategy other than the default (e.g. `--strategy fsdp`), the same step under
    the default strategy too (`phalanx-ddp`), timed in the same rounds: the ratio is the
    strategy's cost or gain on this machine."""
    from phalanx.bench import peers

    default = choose_for_script(None, run.world_size)  # its own options' defaults
    if run.strategy.name == default.name:
        return {}
    return {f"phalanx-{default.name}": peers.phalanx(cfg, tokens, run,
                                                     strategy=build(default, run.topology))}
