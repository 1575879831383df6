"""Test-only (tests/e2e/test_one_job.py puts this folder first on PYTHONPATH): every
Python process of a run appends `<pid> choose` for each evaluation of
`phalanx.config.strategy.choose` and `<pid> parse` for each command-line parse
(`phalanx.cli.dispatch.parse`) to $PHALANX_TEST_COUNT — the real functions wrapped as
their modules finish loading, before any other module imports them by name."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys

WRAP = {"phalanx.config.strategy": ("choose", "choose"), "phalanx.cli.dispatch": ("parse",
                                                                                   "parse")}


def _counted(fn, label):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with open(os.environ["PHALANX_TEST_COUNT"], "a") as fh:
            fh.write(f"{os.getpid()} {label}\n")
        return fn(*args, **kwargs)

    return wrapper


class _Wrapping(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WRAP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        execute, (attr, label) = spec.loader.exec_module, WRAP[name]

        def exec_module(module):
            execute(module)
            setattr(module, attr, _counted(getattr(module, attr), label))

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("PHALANX_TEST_COUNT"):
    sys.meta_path.insert(0, _Wrapping())
