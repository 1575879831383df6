"""The strategy for the world this process joins, decided once: `config.strategy.choose`
with the world size the runtime will see (`cluster.env.detect_launch_env`: torchrun's
variables, Phalanx's, or SLURM's under a plain `srun`, where WORLD_SIZE is not set —
reading only it chose `single` and dropped every DDP option the user gave, while the
runtime built DDP). Torch-free: `phalanx --help` imports the trainer's worker, which
uses it."""

from __future__ import annotations

from typing import Any

from phalanx.cluster.env import detect_launch_env
from phalanx.config.strategy import StrategyChoice, choose


def choose_here(dist_cfg: Any, grad_accum: int) -> StrategyChoice:
    """The run's strategy with its options from `dist_cfg` (the `[dist]` section), for the
    world this process joins — the choice `phalanx.init(strategy=…)` accepts as it is."""
    return choose(dist_cfg, detect_launch_env().world_size, grad_accum)
