"""What a rank is doing, read from its main thread's Python stack.

A stack is a list of `Frame`s, outermost first. `describe` finds the collective the rank
waits in (the innermost torch.distributed function named like one), the user's code
that led there (frames outside torch and Phalanx's internals), and whether any of those
calls sits under a rank-dependent `if` (read with the lint engine from the source file).
"""

from __future__ import annotations

import ast
import os
import sys
import traceback
from dataclasses import dataclass, field
from functools import lru_cache

from phalanx.lint.engine import Context
from phalanx.lint.rules.collectives import COLLECTIVES

_TORCH = os.sep + "torch" + os.sep
_INTERNAL = tuple(os.sep + os.path.join("phalanx", d) + os.sep
                  for d in ("hang", "runtime", "cli", "launch")) + (
    os.sep + "threading.py", os.sep + "runpy.py",
    os.sep + os.path.join("phalanx", "__main__.py"), os.sep + "<frozen ")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str
    code: str = ""


@dataclass
class Activity:
    """One rank's position, as `describe` reads it from its stack."""

    collective: str | None  # e.g. "all_reduce", or "backward (DDP's gradient all-reduce)"
    site: Frame | None  # the innermost user frame
    chain: list[str] = field(default_factory=list)  # user functions, outermost first
    condition: str | None = None  # "`if is_main():` at train.py:145"

    def where(self) -> str:
        if self.site is None:
            return "outside user code"
        return f"{short(self.site.file)}:{self.site.line} in {self.site.function}()"

    def context(self) -> str:
        """` (called from main → train), under `if rank == 0:` at x.py:5`, or ''."""
        via = f" (called from {' → '.join(self.chain[:-1])})" if len(self.chain) > 1 else ""
        return via + (f", under {self.condition}" if self.condition else "")


def main_frame():
    """The main thread's current frame, read from another thread (needs the GIL, which a
    thread blocked in a collective has released); None if it has none."""
    import threading

    ident = threading.main_thread().ident  # (set: the main thread has started)
    return sys._current_frames().get(ident) if ident is not None else None


def main_thread_stack() -> list[Frame]:
    frame = main_frame()
    if frame is None:
        return []
    return [Frame(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
            for f in traceback.extract_stack(frame)]


def short(path: str) -> str:
    cwd = os.getcwd() + os.sep
    return path[len(cwd):] if path.startswith(cwd) else path


def is_user(frame: Frame) -> bool:
    return _TORCH not in frame.file and not any(p in frame.file for p in _INTERNAL) \
        and not frame.file.startswith("<")


def _collective(stack: list[Frame]) -> str | None:
    for frame in reversed(stack):
        if _TORCH in frame.file and "distributed" in frame.file and \
                frame.function in COLLECTIVES:
            return frame.function
    names = {(f.function, os.path.basename(f.file)) for f in stack if _TORCH in f.file}
    if any(name in ("backward", "_engine_run_backward") for name, _ in names):
        return "backward (DDP all-reduces gradients in it)"
    if ("forward", "distributed.py") in names or ("_pre_forward", "distributed.py") in names:
        return "DDP forward (buffer broadcast)"
    return None


def describe(stack: list[Frame]) -> Activity:
    user = [f for f in stack if is_user(f)]
    activity = Activity(_collective(stack), user[-1] if user else None,
                        [f.function for f in user if f.function != "<module>"])
    for frame in reversed(user):  # the innermost rank condition on the way
        cond = rank_condition_at(frame.file, frame.line)
        if cond:
            test = cond[0] if len(cond[0]) <= 60 else cond[0][:57] + "..."
            activity.condition = f"`if {test}:` at {short(frame.file)}:{cond[1]}"
            break
    return activity


@lru_cache(maxsize=64)
def _context(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return Context(path, f.read())
    except (OSError, SyntaxError, ValueError):
        return None


def rank_condition_at(path: str, line: int) -> tuple[str, int] | None:
    """(test, line) of a rank-dependent `if` around the call at `path:line`, if any."""
    ctx = _context(path)
    if ctx is None:
        return None
    for call in ctx.calls:
        if call.lineno == line:
            cond = ctx.rank_condition(call)
            if cond is not None:
                return ast.unparse(cond.test), cond.lineno
    return None
