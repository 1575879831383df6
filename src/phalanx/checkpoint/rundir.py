"""What a run directory (`--out`) is: one run, one writer, one lineage of checkpoints.

- **One writer.** `RunDirLock` holds an exclusive `flock` on `OUT/.phalanx.lock` for
  the life of the run; the file says who holds it (pid, host, start time). A second run
  on the same directory is refused naming the holder. The kernel drops the lock when
  the holder dies, however it dies, so a killed run never blocks the next one.
- **No links.** Nothing Phalanx writes follows a link it did not make: a run directory
  holding one (`phalanx.paths.run_dir_links`) is refused when it is locked, naming the
  link and where it points, before anything is moved or written.
- **One lineage.** `OUT/checkpoints/` only ever holds checkpoints of the current run,
  ascending by step, the newest named by `latest`. When a run starts fresh in a
  directory that holds an earlier run (`--resume never`, no usable checkpoint, or a
  resume from another directory), that run's checkpoints and results are *moved* to
  `OUT/superseded/<time>/`, never deleted and never resumed from by accident; when a
  run resumes from step S, checkpoints newer than S (skipped as corrupt, or a branch
  the user chose not to continue) move there too. Rotation then only ever removes the
  oldest checkpoints of the one lineage — never the newest, never `latest`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

from phalanx.errors import FULL_ERRNOS, UserError, storage_error
from phalanx.paths import RunDir, check_run_dir, create_new, link_error, refuse_link


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

LOCK = RunDir("").lock.name  # the name is RunDir's (tests import it from here)


class RunDirLock:
    """An exclusive lock on a run directory, held until `release` (or process death)."""

    def __init__(self, out: RunDir | Path) -> None:
        self.path = RunDir(out).lock
        self._fd: int | None = None
        self._created = False  # this process made the lock file (it removes it if unused)

    def acquire(self) -> RunDirLock:
        """Refuse a directory holding links (`check_run_dir`: the one check, before the
        run moves or writes anything there), then take the lock."""
        check_run_dir(self.path.parent)
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            try:
                fd, self._created = os.open(self.path, flags | os.O_EXCL, 0o644), True
            except FileExistsError:
                fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if os.path.islink(self.path):
                raise link_error(self.path, f"in the run directory `{self.path.parent}`"
                                 ) from None
            raise UserError(f"cannot create the lock file `{self.path}` ({exc.strerror}). "
                            f"Choose a writable `--out`.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            raise UserError(f"`--out` `{self.path.parent}` is in use by another run "
                            f"({holder}). Wait for it to end or stop it, or choose "
                            f"another `--out`.") from None
        if os.fstat(fd).st_ino != _inode(self.path):  # its maker removed it meanwhile
            os.close(fd)
            return self.acquire()
        self._fd = fd
        return self

    def record_holder(self) -> None:
        """Write who holds the lock into it (after the lock is taken)."""
        if self._fd is None:
            return
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")})
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text.encode(), 0)

    def release(self) -> None:
        """Drop the lock; a lock file this process made in a directory that holds nothing
        else (a start refused before it wrote anything) is removed first, while held."""
        if self._fd is None:
            return
        if self._created and os.listdir(self.path.parent) == [self.path.name]:
            with contextlib.suppress(OSError):
                self.path.unlink()
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def remove_if_unused(out: RunDir | Path) -> None:
    """Remove a run directory this command created, when it is empty (the run was
    refused before it started; a lock file it made went with `RunDirLock.release`, never
    unlinked after: another start may hold it by then)."""
    with contextlib.suppress(OSError):
        Path(out).rmdir()  # only if empty


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path, follow_symlinks=False).st_ino
    except FileNotFoundError:
        return None


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (ValueError, KeyError, OSError, UnicodeDecodeError):
        return "a process that is just starting; its details are not written yet"


def step_of(path: Path) -> int:
    """The step a checkpoint directory's name says (`step-00000120` → 120), or -1."""
    try:
        return int(Path(path).name.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def _stamp(out: Path) -> Path:
    base = RunDir(out).superseded / time.strftime("%Y%m%d-%H%M%S")
    target, n = base, 1
    while os.path.lexists(target):
        target, n = base.with_name(f"{base.name}-{n}"), n + 1
    return target


def _move(items: list[Path], target: Path, keep_under: Path) -> None:
    for item in items:
        dest = target / item.relative_to(keep_under)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(item, dest)


def reconcile(out: RunDir | Path, resume_from: Path | None,
              say: Callable[[str], None]) -> Path | None:
    """Make `OUT/checkpoints` one lineage ending at `resume_from` (None: a fresh start).

    Moves what does not belong — every checkpoint and result of an earlier run on a
    fresh start, checkpoints newer than the one resumed otherwise — to
    `OUT/superseded/<time>/`, says so in one line, and returns that folder (or None).
    """
    run_dir = RunDir(out)
    out, root = run_dir.root, run_dir.checkpoints
    for path in (root, run_dir.superseded):  # checked at the lock; moved through: never
        refuse_link(path, f"in the run directory `{out}`")
    steps = sorted(p for p in root.glob("step-*")) if root.is_dir() else []
    # by name: a checkpoint that is a link is still this run's (never "another directory")
    inside = Path(resume_from) if resume_from is not None and \
        Path(resume_from).absolute().parent.resolve() == root.resolve() else None
    if inside is not None:  # resuming a checkpoint of this lineage
        limit = step_of(inside)
        stray = [p for p in steps if step_of(p) > limit]
        results: list[Path] = []
    else:  # a fresh start: the earlier run moves, a torchft run's groups too (one_run)
        stray = steps + [p for p in (root / "latest",) if p.exists()]
        results = [out / name for name in RunDir.RESULTS if (out / name).exists()] \
            + run_dir.replicas()
    if not stray and not results:
        return None
    _not_moving(resume_from, stray + results, out)
    target = _stamp(out)
    _move(stray + results, target, out)
    fsync_dir(root if root.is_dir() else out)
    moved = [p.name for p in stray if p.name.startswith("step-")]
    groups = [p for p in results if p.name.startswith("replica-")]
    files = len(results) - len(groups)
    why = (f"checkpoints newer than {inside.name} (not part of the run being "
           f"continued)" if inside is not None else "the previous run in this directory "
           "(this run starts fresh)")
    say(f"moved {why}: {len(moved)} checkpoint(s)"
        + (f" and {files} result file(s)" if files else "")
        + (f" and {len(groups)} torchft replica group run(s)" if groups else "")
        + f" to {target} — nothing was deleted.")
    return target


def _not_moving(resume_from: Path | None, moving: list[Path], out: Path) -> None:
    """Refuse a start whose checkpoint lies in what it would move aside (e.g. `--resume
    OUT/replica-0/checkpoints/step-N`: a torchft group's run moves with the earlier run)."""
    if resume_from is None:
        return
    target = Path(resume_from).resolve()
    for path in moving:
        if target.is_relative_to(path.resolve()):
            raise UserError(f"`--resume {resume_from}` lies in `{path}`, which starting this "
                            f"run in `{out}` would move to `{RunDir(out).superseded}` as "
                            f"part of the earlier run there. Copy that checkpoint out of "
                            f"`{out}` and resume from the copy, or choose another `--out`.")


def one_run(out: RunDir | Path, torchft: bool, resume: str) -> None:
    """A run directory holds one run: with `--resume auto`, refuse a run of the other
    `--fault-tolerance` mode in it (a torchft run's `replica-*` groups for a run without
    torchft; the checkpoints and results of a run without it for a torchft launch) in one
    line. Any other `--resume` starts fresh: `reconcile` moves it to `OUT/superseded/`.
    Links in `out` are refused first (`check_run_dir`); nothing is written (called before
    the lock is taken, a refusal leaves no lock file)."""
    run_dir = RunDir(out)
    check_run_dir(run_dir)
    if torchft:
        found = [p for p in (run_dir.checkpoints,) if p.is_dir() and any(p.iterdir())]
        if not run_dir.ft_result.is_file():  # (else the result a torchft run
            found += [run_dir / n for n in RunDir.RESULTS if (run_dir / n).exists()]  # left)
        held, here = "a run without `--fault-tolerance`", "uses `--fault-tolerance torchft`"
        fix = "Drop `--fault-tolerance torchft` to continue it"
    else:
        found = run_dir.replicas()
        held, here = "a `--fault-tolerance torchft` run", "is without `--fault-tolerance`"
        fix = "Add `--fault-tolerance torchft` to continue it"
    if found and resume == "auto":
        names = ", ".join(f"`{p.name}`" for p in found[:3]) + (", …" if found[3:] else "")
        raise UserError(f"`{run_dir}` holds {held} ({names}), and this run {here}: a "
                        f"run directory holds one run. {fix}, start over with `--resume "
                        f"never` (that run is moved to `{run_dir.superseded}/`), or choose "
                        f"another `--out`.")


def prepare_out_dir(path: str) -> RunDir:
    """Create the run directory and prove it is writable, or say why it is not: the one
    `RunDir` value of the run, handed down from here."""
    out = Path(path).expanduser()
    probe = out / f".phalanx-write-test-{os.getpid()}"  # one per rank: no race
    try:
        out.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # left by a process SIGKILLed here
            probe.unlink()  # (unlink removes a link, never what it points to)
        create_new(probe, "ok")  # O_EXCL: never through a link planted at its name
        probe.unlink()
    except OSError as exc:
        full = storage_error(exc, out) if exc.errno in FULL_ERRNOS else None
        if full is not None:  # a full disk: say so, not that the folder is not writable
            raise full from None
        raise UserError(f"`--out` `{path}` is not a writable directory ({exc.strerror}). "
                        f"Choose a directory you can write to.") from None
    return RunDir(out)
