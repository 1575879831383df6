"""`phalanx train`: the command line parsed into a config; the run itself (checks,
launch, a worker's start from its job) is launch.train_run's."""

from __future__ import annotations

import argparse

from phalanx.cluster.startup_trace import mark
from phalanx.config.flags import add_config_flags, resolve
from phalanx.launch.train_run import run_job, train_config

__all__ = ["add_arguments", "run_job", "run_train"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_flags(parser)


def run_train(ns: argparse.Namespace, argv: list[str]) -> int:
    cfg = resolve(ns)
    mark("config resolved")

    def memory(world: int) -> str:  # beside a rank the kernel killed: the plan's peak
        from phalanx.plan.oom import predicted_peak_note

        return predicted_peak_note(cfg, world)

    return train_config(cfg, argv, memory)
