"""What a path the user named is, said in words, so that only regular files are read;
and how Phalanx writes into a run directory without following a link it did not make.

A FIFO read blocks forever, `/dev/zero` never ends, a directory is not a file: each is
refused before it is opened, with a message that says what was found.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any, ClassVar

from phalanx.errors import UserError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"))


def kind(path: Path) -> str:
    """`a directory`, `a FIFO (named pipe)`, …, or `missing` (a dangling link too)."""
    try:
        mode = Path(path).stat().st_mode
    except (OSError, ValueError):
        return "missing"
    return _kind_of(mode)


def _kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def require_file(path: str | Path, what: str, hint: str) -> Path:
    """`path` as a Path if it is a regular file; else a UserError naming what it is."""
    p = Path(path).expanduser()
    found = kind(p)
    if found == "a regular file":
        return p
    if found == "missing":
        raise UserError(f"{what} `{path}` does not exist. {hint}")
    raise UserError(f"{what} `{path}` is {found}, not a regular file. {hint}")


# --- Writing into a run directory: never through a link Phalanx did not make ---------
#
# A run directory may come from elsewhere (a copy, a shared filesystem) or be writable by
# others; a link planted in it would make a write, a move or a delete land outside it.
# The run directory is checked once when it is locked (`check_run_dir`, `RunDirLock`);
# each write below also refuses or replaces a link met at that moment, so one planted
# between the check and the write is never followed. `--out` itself may be a link.

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


HANG_REPORT = "hang-report.txt"  # the watchdog's report, in a run directory or `watch`'s


@dataclasses.dataclass(frozen=True)
class RunDir:
    """One run directory (`--out`): every name Phalanx reads or writes in it, spelled here
    once. Made once from `--out` by the verb (`checkpoint.rundir.prepare_out_dir`) and
    handed down to the launcher, the workers, the loop, the checkpoints and the report."""

    root: Path

    SUBDIRS: ClassVar[tuple[str, ...]] = ("checkpoints", "logs", "tb")  # written below the top
    # a run's results: moved with its checkpoints when a new run starts fresh in the directory
    RESULTS: ClassVar[tuple[str, ...]] = (
        "metrics.jsonl", "loss.png", "sample.txt", "model.safetensors", "config.json",
        "run_config.json", HANG_REPORT, "profile", "ft-steps.jsonl",  # (a torchft group's)
        "ft-samples.jsonl",  # (PHALANX_FT_SAMPLES: its step attempts' samples)
        "ft-result.json",  # (a torchft run's: which group its published result is from)
        "goodput.jsonl")  # (report.goodput's ledger)

    def __init__(self, root: str | os.PathLike[str]) -> None:  # a str, Path or RunDir
        object.__setattr__(self, "root", Path(root))

    def __fspath__(self) -> str:  # accepted wherever a path is (open, os.*, Path(...))
        return str(self.root)

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    def __str__(self) -> str:
        return str(self.root)

    @property
    def name(self) -> str:
        return self.root.name

    checkpoints = property(lambda self: self.root / "checkpoints")
    logs = property(lambda self: self.root / "logs")  # rank-N.log of each worker
    tb = property(lambda self: self.root / "tb")  # TensorBoard event files
    metrics = property(lambda self: self.root / "metrics.jsonl")
    events = property(lambda self: self.root / "events.jsonl")
    run_config = property(lambda self: self.root / "run_config.json")
    environment = property(lambda self: self.root / "environment.json")
    job = property(lambda self: self.root / "job.json")  # the launcher's job (launch.job)
    model = property(lambda self: self.root / "model.safetensors")
    model_config = property(lambda self: self.root / "config.json")
    loss_plot = property(lambda self: self.root / "loss.png")
    sample = property(lambda self: self.root / "sample.txt")
    report = property(lambda self: self.root / "report.html")
    profile = property(lambda self: self.root / "profile")  # --profile-steps' traces
    ft_result = property(lambda self: self.root / "ft-result.json")  # (ft.publish)
    lock = property(lambda self: self.root / ".phalanx.lock")
    superseded = property(lambda self: self.root / "superseded")

    def replica(self, name: str) -> Path:
        """Replica group NAME's run directory in a `--fault-tolerance torchft` run."""
        return self.root / f"replica-{name}"

    def group_job(self, name: str) -> Path:
        """The job a torchft launcher hands replica group NAME (`launch.job`)."""
        return self.root / f"job-replica-{name}.json"

    def launcher_job(self, host: str, pid: int) -> Path:
        """The job one machine's launcher of a several-machine run hands its workers (each
        launcher its own: the machines may share OUT; removed when the launcher ends)."""
        safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in host)
        return self.root / f"job-launcher-{safe}-{pid}.json"

    def replicas(self) -> list[Path]:
        """The replica groups' run directories in it (a torchft run's), by name."""
        return [Path(e.path) for e in _entries(self.root) if e.name.startswith("replica-")]


RUN_SUBDIRS = RunDir.SUBDIRS


def parse_json(text: str | bytes) -> Any:
    """`json.loads`, where text nested too deeply for Python's parser (it recurses once
    per level: `RecursionError`) is a `ValueError` like any other JSON it cannot read —
    so every reader that refuses bad JSON in one line refuses it too."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"nested too deeply to read (more than ~{sys.getrecursionlimit()} "
                         f"levels of arrays or objects)") from None


def shown(text: object) -> str:
    """`text` on one line: a line break or other control character in a (planted) name
    is shown escaped, never printed."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def link_target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def link_error(link: Path, where: str, hint: str = "", does: str = "writes") -> UserError:
    """One line: the link, where it points, that Phalanx does not write (`does`: or read)
    through it, and the fix."""
    return UserError(f"`{shown(link)}` is a link (→ `{shown(link_target(link))}`) "
                     f"{shown(where)}; Phalanx {does} nothing through a link it did not "
                     f"make. {hint or 'Remove the link or choose another `--out`.'}")


def read_regular(path: Path, where: str, hint: str) -> bytes | None:
    """The bytes of the regular file `path` (None when nothing is there), opened without
    following a link (a link: `link_error`) and without blocking (a FIFO, a device: a
    UserError naming what it is) — for a file of a run directory Phalanx reads and copies."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise link_error(Path(path), where, hint, does="reads") from None
        raise UserError(f"`{shown(path)}` {where} cannot be read ({exc.strerror}). "
                        f"{hint}") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UserError(f"`{shown(path)}` {where} is {_kind_of(mode)}, not a regular "
                            f"file. {hint}")
        return fh.read()


def _entries(directory: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError:  # missing, not a directory, unreadable: nothing to find (writes fail)
        return []


def run_dir_links(out: str | os.PathLike) -> list[Path]:
    """Links inside run directory `out` where Phalanx writes or moves things: its own
    entries, those of `checkpoints/` (and of each checkpoint in it), `logs/` and `tb/`.
    `out` itself being a link is the user's choice and is not reported."""
    out, found = Path(out), []
    for entry in _entries(out):
        if entry.is_symlink():
            found.append(out / entry.name)
        elif entry.name in RUN_SUBDIRS and entry.is_dir(follow_symlinks=False):
            for inner in _entries(out / entry.name):
                if inner.is_symlink():
                    found.append(out / entry.name / inner.name)
                elif entry.name == RunDir.SUBDIRS[0] and inner.is_dir(follow_symlinks=False):
                    found += [Path(inner.path) / e.name for e in _entries(Path(inner.path))
                              if e.is_symlink()]
    return found


def check_run_dir(out: str | os.PathLike) -> None:
    """Refuse run directory `out` when it holds a link (`run_dir_links`): a UserError
    naming the first, where it points and the fix — before anything is moved or written."""
    links = run_dir_links(out)
    if links:
        more = (f" (and {len(links) - 1} more: "
                + ", ".join(f"`{p.relative_to(out)}`" for p in links[1:4])
                + (", …" if len(links) > 4 else "") + ")") if len(links) > 1 else ""
        raise link_error(links[0], f"in the run directory `{out}`{more}")


def refuse_link(path: Path, where: str = "in the run directory", hint: str = "") -> None:
    """A UserError if `path` (not what it points to) is a link."""
    if os.path.islink(path):
        raise link_error(path, where, hint)


def ensure_dir(path: str | os.PathLike, where: str = "in the run directory") -> Path:
    """`mkdir -p path`, refusing when `path` is a link (mkdir would accept one to a
    directory and every write below would land where it points)."""
    path = Path(path)
    refuse_link(path, where)
    path.mkdir(parents=True, exist_ok=True)
    refuse_link(path, where)  # planted between the two
    return path


def remove_tree(path: str | os.PathLike) -> None:
    """Remove `path` whatever it is, quietly: a link is unlinked (never what it points
    to: `shutil.rmtree` refuses a link and would leave it in place), a directory removed
    with everything in it."""
    import shutil

    path = Path(path)
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass


def _create(path: Path, mode: int) -> int:
    """A new file at `path` (O_EXCL: a link or anything else there is an error, never
    followed)."""
    return os.open(path, _CREATE, mode)


def _write_all(fd: int, data: bytes, sync: bool) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    if sync:
        os.fsync(fd)


def create_new(path: str | os.PathLike, data: bytes | str, *, sync: bool = False,
               mode: int = 0o666) -> None:
    """Write a file that must not exist yet (FileExistsError if anything is there, a link
    included); `sync`: fsync it."""
    fd = _create(Path(path), mode)
    try:
        _write_all(fd, data.encode() if isinstance(data, str) else data, sync)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes | str, *, sync: bool = False,
                 mode: int = 0o666) -> Path:
    """Replace `path` with `data` (str: UTF-8): written to `.NAME.tmp` beside it, created
    new (a stale temporary or a link planted there is removed, never followed), then
    renamed over `path` — which replaces a link at `path` rather than writing where it
    points. `sync`: fsync the file before the rename. Readers see the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    for attempt in range(3):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        try:
            fd = _create(tmp, mode)
            break
        except FileExistsError:  # planted again between the unlink and the create
            if attempt == 2:
                raise
    try:
        try:
            _write_all(fd, data.encode() if isinstance(data, str) else data, sync)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # (fails e.g. when `path` is a directory: no temporary left)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def replacing(path: str | os.PathLike, mode: int = 0o666):
    """For a library that writes a file by name (safetensors): yields a path in a new
    private directory beside `path` (mkdtemp: mode 0700) to write to; on success it gets
    the umask's permissions and is renamed over `path` (a link there is replaced, not
    followed). The private directory is removed either way."""
    import shutil
    import tempfile

    path = Path(path)
    private = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        tmp = private / path.name
        yield tmp
        os.chmod(tmp, mode & ~current_umask(), follow_symlinks=False)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def open_append(path: str | os.PathLike, mode: int = 0o666, *, fresh: bool = False) -> int:
    """A descriptor appending to `path` (created if missing; `fresh`: emptied first, for a
    stream a run starts afresh); a link there is refused (`link_error`), not followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags | (os.O_TRUNC if fresh else 0), mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise link_error(Path(path), "in the run directory") from None
        raise


def current_umask() -> int:
    """The process's umask, read without setting it (os.umask sets it, for every thread:
    a file another thread makes meanwhile would get mode 0666)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
