"""A run directory held for a run's life: the orchestration `phalanx train`
(launch.train_run) and `phalanx run` (launch.script_run) share (the line a stopped run
ends with is errors.stopped_line, said by workers too).

`held(out)`: OUT locked (one run per directory; the lock is dropped when the process
ends, however it ends) and its holder recorded for the next run's message;
`refused_leaves_nothing`: a run refused before anything ran leaves no directory it
created behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from phalanx.checkpoint.rundir import RunDirLock, remove_if_unused
from phalanx.errors import UserError
from phalanx.paths import RunDir


def created_here(path: str | Path) -> bool:
    """Whether the run directory at `path` is new (made by this run)."""
    return not Path(path).expanduser().exists()


@contextlib.contextmanager
def refused_leaves_nothing(out: RunDir, created: bool) -> Iterator[None]:
    """A UserError out of this block (refused before anything ran) removes the run
    directory when this run `created` it and nothing else is in it."""
    try:
        yield
    except UserError:
        if created:
            remove_if_unused(out)
        raise


@contextlib.contextmanager
def held(out: RunDir, record: bool = True) -> Iterator[RunDirLock]:
    """OUT locked for the block (a second run on it is refused in one line); `record`:
    its holder written at once (False: the caller records it once its checks pass)."""
    with RunDirLock(out) as lock:
        if record:
            lock.record_holder()
        yield lock

