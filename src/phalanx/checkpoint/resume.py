"""Which checkpoint to resume from: `--resume auto | never | PATH`.

`auto` takes the most recently committed checkpoint under `OUT/checkpoints` that
verifies (manifest present, every file listed with its size and checksum, nothing
outside the directory, metadata safe) and warns, naming each newer one it skipped and
why. "Most recently committed" is the order of the manifests' commit times, which is
also the order `latest` moves in: the run directory holds one lineage (see
checkpoint.rundir), and a directory written before lineages existed cannot have an
older run's higher step beat the current run's newest. A `PATH` must be a checkpoint
directory that verifies, or a run / checkpoints directory holding one.

A checkpoint is verified once per start: the launcher that checked it before starting
the workers names it in the job it hands them (`verified_token`: its path and its
manifest's checksum; launch.job), and rank 0, given that token as `verified`, checks
everything but the file checksums again (the manifest must be the same bytes). Any other
checkpoint — a restart that picks a newer one — is verified in full.

On an elastic restart (TORCHELASTIC_RESTART_COUNT > 0) `never` and `PATH` mean `auto`
when the run has committed a checkpoint of its own: the restarted workers continue the
run they belong to instead of starting it over.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from phalanx.checkpoint.digest import file_digest
from phalanx.checkpoint.safety import UnsafeCheckpoint
from phalanx.checkpoint.store import MANIFEST, commit_order, committed_at, read_latest, verify
from phalanx.cluster.rendezvous import restart_attempt
from phalanx.errors import UserError
from phalanx.paths import RunDir


def checkpoints_dir(out_dir: Path | RunDir) -> Path:
    return RunDir(out_dir).checkpoints




def verified_token(path: Path) -> str:
    """Names checkpoint `path` as verified: its absolute path and its manifest's checksum."""
    path = Path(path).resolve()
    try:
        return f"{path}|{file_digest(path / MANIFEST)}"
    except OSError:
        return f"{path}|unreadable"


def _reason(path: Path, verified: str | None) -> str | None:
    """Why `path` must not be used (None: it verifies); `verified`: the token of the
    checkpoint the launcher verified in full, whose file checksums are not read again."""
    # the token costs a read: only when one was named
    contents = verified is None or verified != verified_token(path)
    try:
        return verify(path, contents=contents)
    except UnsafeCheckpoint as exc:
        return str(exc)


def newest_valid(root: Path, warn: Callable[[str], None],
                 verified: str | None = None) -> Path | None:
    """Newest checkpoint under `root` that verifies; each skipped one is named with why
    (`verified`: see `_reason`)."""
    if not root.is_dir():
        return None
    candidates = commit_order(root.glob("step-*"))[::-1]
    for path in candidates:
        reason = _reason(path, verified)
        if reason is None:
            latest = read_latest(root)
            if latest is not None and latest != path and latest.exists() \
                    and (committed_at(path) or 0) > (committed_at(latest) or 0):
                warn(f"warning: `latest` names {latest.name}, but {path.name} was committed "
                     f"after it (a stop between the commit and the marker); using "
                     f"{path.name}.")
            return path
        warn(f"warning: skipping checkpoint `{path}`: {reason}")
    return None


def resolve_resume(arg: str, out_dir: RunDir | Path, warn: Callable[[str], None],
                   verified: str | None = None) -> Path | None:
    """The checkpoint directory to resume from, or None to start fresh (`verified`: the
    token of the one the launcher verified in full, see `_reason`)."""
    if arg != "auto" and restart_attempt() > 0:
        own = newest_valid(checkpoints_dir(out_dir), warn, verified)
        if own is not None:
            return own
    if arg == "never":
        return None
    if arg == "auto":
        return newest_valid(checkpoints_dir(out_dir), warn, verified)
    return find_checkpoint(arg, warn, "`--resume` path", " or `auto`/`never`", verified)


def find_checkpoint(arg: str, warn: Callable[[str], None], what: str = "path",
                    alternatives: str = "", verified: str | None = None) -> Path:
    """The checkpoint `arg` names: itself if it verifies, else the newest valid one in it
    (a run directory or a checkpoints directory). UserError when there is none."""
    path = Path(arg).expanduser()
    if not path.exists():
        raise UserError(f"{what} `{arg}` does not exist. Give a checkpoint directory "
                        f"(…/checkpoints/step-…), a run directory{alternatives}.")
    if (path / MANIFEST).exists() or (path / ".metadata").exists():
        reason = _reason(path, verified)
        if reason is not None:
            raise UserError(f"{what} `{arg}` cannot be used: {reason}.")
        return path
    for root in (checkpoints_dir(path), path):
        found = newest_valid(root, warn, verified)
        if found is not None:
            return found
    raise UserError(f"{what} `{arg}` is not a checkpoint and holds no valid checkpoint. "
                    f"Give a directory written by `phalanx train` (its `checkpoints/step-…`)"
                    f"{alternatives}.")
