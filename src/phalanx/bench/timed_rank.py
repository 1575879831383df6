"""One rank of `phalanx bench`: every implementation's step timed in the same rounds (and,
asked for, the defaults put back, the profile, the scaling sweep); rank 0 writes the
measurement as JSON for the launching process (phalanx.bench.parent)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from phalanx.bench import defaults, flops, peers, runner, scaling
from phalanx.config.sections import from_dict
from phalanx.data.corpus import prepare_data
from phalanx.models import build_model
from phalanx.paths import atomic_write
from phalanx.runtime.choice import choose_here
from phalanx.runtime.init import init
from phalanx.strategies import build, choose_for_script


def worker(spec: dict) -> int:
    cfg = from_dict(spec["config"])
    tokens = prepare_data(cfg.data)  # the splits: training tokens and the vocabulary
    spec = {**spec, "vocab_size": tokens.vocab_size}
    # no straggler check: `--scaling` steps a subset of the ranks (a collective in
    # run.step would meet another one), and the timings are the steps' alone
    run = init(cfg.train.seed, backend=cfg.dist.backend, threads=spec["threads"],
               strategy=choose_here(cfg.dist, cfg.train.grad_accum), straggler_every=0)
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
    model = build_model(cfg, spec["vocab_size"])
    n_params, m = flops.matmul_params(model), cfg.model
    per_token = flops.flops_per_token(n_params, m.n_layer, m.n_embd, m.block_size)
    tokens_per_step = cfg.tokens_per_step(run.world_size)
    device = torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "CPU"
    tps = tokens_per_step / statistics.median(times["phalanx"])
    res = {"config": spec["config"], "world_size": run.world_size, "threads": run.threads,
           "strategy": run.strategy.label, "device_name": device, "versions": peers.versions(),
           "repeats": len(times["phalanx"]), "repeats_asked": spec["repeats"],
           "steps": spec["steps"],
           "tokens_per_step": tokens_per_step, "matmul_params": n_params,
           "flops_per_token": per_token, "peak_flops": flops.peak_flops(device),
           "mfu": flops.mfu(tps, per_token, device, run.world_size),
           "peers": {name: times[name] for name in names}, "profile": prof, "scaling": sweep,
           "defaults": [{**d, "times": times[d["label"]]} for d in variant_info],
           "stopped": stopped}
    atomic_write(spec["result"], json.dumps(res))  # a link planted there: replaced


def baseline_step(cfg, tokens, run) -> dict:
    """With a strategy other than the default (e.g. `--strategy fsdp`), the same step under
    the default strategy too (`phalanx-ddp`), timed in the same rounds: the ratio is the
    strategy's cost or gain on this machine."""
    default = choose_for_script(None, run.world_size)  # its own options' defaults
    if run.strategy.name == default.name:
        return {}
    return {f"phalanx-{default.name}": peers.phalanx(cfg, tokens, run,
                                                     strategy=build(default, run.topology))}
