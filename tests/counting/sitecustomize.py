"""Test-only (tests/e2e/test_one_job.py puts this folder first on PYTHONPATH): every
Python process of a run appends `<pid> choose` for each evaluation of
`phalanx.config.strategy.choose`, `<pid> parse` for each command-line parse
(`phalanx.cli.dispatch.parse`) and `<pid> verify-full` / `verify-manifest` for each
checkpoint verified with / without its file checksums (`phalanx.checkpoint.store.verify`)
to $PHALANX_TEST_COUNT — the real functions wrapped as
their modules finish loading, before any other module imports them by name."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys


def _verify_label(args, kwargs) -> str:
    """`verify-full` when a checkpoint's file checksums are read, else `verify-manifest`."""
    contents = kwargs.get("contents", args[1] if len(args) > 1 else True)
    return "verify-full" if contents else "verify-manifest"


WRAP = {"phalanx.config.strategy": ("choose", "choose"), "phalanx.cli.dispatch": ("parse",
                                                                                   "parse"),
        "phalanx.checkpoint.store": ("verify", _verify_label)}


def _counted(fn, label):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        said = label(args, kwargs) if callable(label) else label
        with open(os.environ["PHALANX_TEST_COUNT"], "a") as fh:
            fh.write(f"{os.getpid()} {said}\n")
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
