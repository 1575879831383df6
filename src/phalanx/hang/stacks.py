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

from phalanx.hang.collectives import module_called, name_collective, phase
from phalanx.lint.engine import Context

_TORCH = os.sep + "torch" + os.sep
_INTERNAL = tuple(os.sep + os.path.join("phalanx", d) + os.sep
                  for d in ("hang", "runtime", "cli", "launch", "strategies",
                            "checkpoint")) + (  # (strategies, checkpoint: Phalanx's layers
    # over torch's DDP/FSDP/DCP, whose frames are not the user's either)
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
    user: list[Frame] = field(default_factory=list)  # the user frames, outermost first

    def called_from(self) -> str:
        """` (called from train.py:32)`: the user frame that called the innermost one."""
        if len(self.user) < 2:
            return ""
        caller = self.user[-2]
        return f" (called from {short(caller.file)}:{caller.line})"

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


def _frames(frame) -> list[Frame]:
    return [Frame(f.filename, f.lineno or 0, f.name, (f.line or "").strip())
            for f in traceback.extract_stack(frame)]


def main_thread_stack() -> list[Frame]:
    frame = main_frame()
    return [] if frame is None else _frames(frame)


def rank_stack() -> list[Frame]:
    """The main thread's stack; when it waits in autograd's engine, followed by the frames
    of a thread in torch.distributed (on a GPU, autograd runs FSDP's backward hooks on its
    device thread while the main thread waits in `_engine_run_backward`)."""
    import threading

    stack = main_thread_stack()
    if not stack or stack[-1].function not in ("_engine_run_backward", "run_backward"):
        return stack
    main, me = threading.main_thread().ident, threading.get_ident()
    for ident, frame in sys._current_frames().items():
        if ident in (main, me):
            continue
        other = _frames(frame)
        if any(_TORCH in f.file and "distributed" in f.file for f in other):
            return stack + other
    return stack


# torch's wrappers, by class name, that tell a backward's collective apart
WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel", "FSDPModule",
            "ZeroRedundancyOptimizer")


def live_wrappers() -> list[str]:
    """The torch wrapper classes with an instance alive in this process (one pass over
    the garbage collector's objects: only when a hang is reported)."""
    import gc

    kinds = {type(obj) for obj in gc.get_objects()}
    return sorted({c.__name__ for kind in kinds for c in kind.__mro__
                   if c.__name__ in WRAPPERS})


def short(path: str) -> str:
    cwd = os.getcwd() + os.sep
    return path[len(cwd):] if path.startswith(cwd) else path


def is_user(frame: Frame) -> bool:
    return _TORCH not in frame.file and not any(p in frame.file for p in _INTERNAL) \
        and not frame.file.startswith("<")


def describe(stack: list[Frame], wrappers: frozenset[str] | None = None) -> Activity:
    """Where the rank is; `wrappers`: the torch wrapper classes alive in its process
    (see `live_wrappers`; None: not known)."""
    user = [f for f in stack if is_user(f)]
    activity = Activity(_named(stack, user, wrappers), user[-1] if user else None,
                        [f.function for f in user if f.function != "<module>"], user=user)
    for frame in reversed(user):  # the innermost rank condition on the way
        cond = rank_condition_at(frame.file, frame.line)
        if cond:
            test = cond[0] if len(cond[0]) <= 60 else cond[0][:57] + "..."
            activity.condition = f"`if {test}:` at {short(frame.file)}:{cond[1]}"
            break
    return activity


def _named(stack: list[Frame], user: list[Frame], wrappers) -> str | None:
    """The collective's name, with the module whose forward runs it when the call line
    names one ("FSDP all-gather in the forward of `model`")."""
    name = name_collective(stack, wrappers)
    if name and name.endswith("in the forward") and user and phase(stack) == "forward":
        module = module_called(user[-1].code or _source_line(user[-1]))
        if module:
            name += f" of `{module}`"
    return name


def _source_line(frame: Frame) -> str:
    import linecache

    return linecache.getline(frame.file, frame.line).strip()


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
