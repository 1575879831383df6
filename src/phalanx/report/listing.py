"""The run directory's checkpoints as the report lists them, without ever following a
symbolic link: a `checkpoints/step-*` that is a link is named as one and not sized, and
links inside a checkpoint are counted, not followed (a link to a big file elsewhere
would otherwise be summed as the run's, and a link to `/` walked)."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from phalanx.checkpoint.manifest import MANIFEST
from phalanx.paths import RunDir
from phalanx.report.records import read_text


@dataclass
class Checkpoint:
    name: str
    link: bool = False  # the entry is a symbolic link (not followed)
    size: int = 0  # bytes of regular files inside, links not followed
    links: int = 0  # symbolic links inside, not followed
    unreadable: int = 0  # directories inside that could not be listed


def list_checkpoints(run_dir: Path) -> tuple[list[Checkpoint], str | None, str | None]:
    """(the `step-*` entries of `run_dir/checkpoints`, by name; the name `latest` gives;
    a note when `checkpoints` itself is not listed)."""
    root = RunDir(run_dir).checkpoints
    try:
        mode = os.lstat(root).st_mode
    except OSError:
        return [], None, None
    if stat.S_ISLNK(mode):
        return [], None, "`checkpoints` is a symbolic link, not followed"
    if not stat.S_ISDIR(mode):
        return [], None, None
    try:
        with os.scandir(root) as it:
            entries = sorted((e for e in it if e.name.startswith("step-")),
                             key=lambda e: e.name)
    except OSError as exc:
        return [], None, f"`checkpoints` could not be listed ({exc.strerror})"
    found = []
    for entry in entries:
        if entry.is_symlink():
            found.append(Checkpoint(entry.name, link=True))
        elif entry.is_dir(follow_symlinks=False):
            found.append(_sized(Checkpoint(entry.name), entry.path))
    return found, _latest(root), None


def _sized(ckpt: Checkpoint, top: str) -> Checkpoint:
    def unreadable(_: OSError) -> None:
        ckpt.unreadable += 1

    for here, dirs, files in os.walk(top, followlinks=False, onerror=unreadable):
        for name in dirs + files:
            try:
                st = os.lstat(os.path.join(here, name))
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                ckpt.links += 1
            elif stat.S_ISREG(st.st_mode):
                ckpt.size += st.st_size
    return ckpt


def _latest(root: Path) -> str | None:
    """The checkpoint the `latest` marker names (read without following a link)."""
    text = read_text(root / "latest", lambda _: None, limit=4096)
    name = (text or "").strip()
    if not name.startswith("step-") or "/" in name or len(name) > 255:
        return None
    return name


def recorded_world_size(run_dir: Path, checkpoints: list[Checkpoint],
                        latest: str | None) -> int | None:
    """The world size the newest checkpoint's manifest records (None if none does)."""
    names = [c.name for c in checkpoints if not c.link]
    order = ([latest] if latest in names else []) + names[::-1]
    for name in order:
        text = read_text(RunDir(run_dir).checkpoints / name / MANIFEST,
                         lambda _: None)
        try:
            world = json.loads(text or "").get("world_size")
        except (ValueError, RecursionError, AttributeError):
            continue
        if isinstance(world, int) and not isinstance(world, bool) and 0 < world < 2**31:
            return world
    return None
