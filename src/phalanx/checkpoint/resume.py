"""Which checkpoint to resume from: `--resume auto | never | PATH`.

`auto` takes the newest committed checkpoint under `OUT/checkpoints` that verifies
(manifest present, every file's size and checksum right, metadata safe) and warns,
naming each newer one it skipped and why. A `PATH` must be a checkpoint directory that
verifies, or a run / checkpoints directory holding one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from phalanx.checkpoint.safety import UnsafeCheckpoint
from phalanx.checkpoint.store import MANIFEST, verify
from phalanx.errors import UserError


def checkpoints_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def _reason(path: Path) -> str | None:
    try:
        return verify(path)
    except UnsafeCheckpoint as exc:
        return str(exc)


def newest_valid(root: Path, warn: Callable[[str], None]) -> Path | None:
    """Newest checkpoint under `root` that verifies; each skipped one is named with why."""
    if not root.is_dir():
        return None
    for path in sorted(root.glob("step-*"), reverse=True):
        reason = _reason(path)
        if reason is None:
            return path
        warn(f"warning: skipping checkpoint `{path}`: {reason}")
    return None


def resolve_resume(arg: str, out_dir: Path, warn: Callable[[str], None]) -> Path | None:
    """The checkpoint directory to resume from, or None to start fresh."""
    if arg == "never":
        return None
    if arg == "auto":
        return newest_valid(checkpoints_dir(out_dir), warn)
    return find_checkpoint(arg, warn, "`--resume` path", " or `auto`/`never`")


def find_checkpoint(arg: str, warn: Callable[[str], None], what: str = "path",
                    alternatives: str = "") -> Path:
    """The checkpoint `arg` names: itself if it verifies, else the newest valid one in it
    (a run directory or a checkpoints directory). UserError when there is none."""
    path = Path(arg).expanduser()
    if not path.exists():
        raise UserError(f"{what} `{arg}` does not exist. Give a checkpoint directory "
                        f"(…/checkpoints/step-…), a run directory{alternatives}.")
    if (path / MANIFEST).exists() or (path / ".metadata").exists():
        reason = _reason(path)
        if reason is not None:
            raise UserError(f"{what} `{arg}` cannot be used: {reason}.")
        return path
    for root in (checkpoints_dir(path), path):
        found = newest_valid(root, warn)
        if found is not None:
            return found
    raise UserError(f"{what} `{arg}` is not a checkpoint and holds no valid checkpoint. "
                    f"Give a directory written by `phalanx train` (its `checkpoints/step-…`)"
                    f"{alternatives}.")
