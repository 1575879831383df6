"""Where a rank was when it died of a signal (SIGABRT from gloo's size check, SIGSEGV).

A watched rank has `faulthandler` write every Python thread's stack to
`<report dir>/.phalanx-crash-rank<R>.txt` if it dies of a fatal signal; the launcher
reads the main thread's stack from there and says where the rank was — the same
description as the hang report. The file is removed when the rank exits normally.
It is created new (a stale one, or a link planted at its name, is removed first — never
followed) and read back without following a link.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import threading
from pathlib import Path

from phalanx.hang.stacks import Activity, Frame, describe

_HEADER = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')
_TB_FRAME = re.compile(r'File "(.+)", line (\d+), in (.+)')
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def crash_file(report_dir: Path, rank: int) -> Path:
    return report_dir / f".phalanx-crash-rank{rank}.txt"


class CrashRecorder:
    def __init__(self, report_dir: Path, rank: int) -> None:
        self.path = crash_file(report_dir, rank)
        self.file = None
        try:
            report_dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):  # stale, or a link: removed
                os.unlink(self.path)
            fd = os.open(self.path, _CREATE, 0o666)  # planted again meanwhile: refused
            self.file = os.fdopen(fd, "w")  # noqa: SIM115 — open until exit
            self.file.write(f"main-thread {threading.main_thread().ident:#018x}\n")
            self.file.flush()
            faulthandler.enable(file=self.file, all_threads=True)
        except OSError:
            self.file = None  # no report dir to write to: no crash record

    def close(self) -> None:
        if self.file is not None:
            faulthandler.disable()
            self.file.close()
            self.path.unlink(missing_ok=True)
            self.file = None


def main_stack_from_dump(text: str) -> list[Frame]:
    """The main thread's frames (outermost first) from a faulthandler dump."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("main-thread "):
        return []
    main, frames, current = int(lines[0].split()[1], 16), [], None
    for line in lines[1:]:
        header = _HEADER.match(line)
        if header:
            current = int(header[1], 16)
            continue
        frame = _FRAME.match(line)
        if frame and current == main:
            frames.append(Frame(frame[1], int(frame[2]), frame[3]))
    return list(reversed(frames))  # faulthandler lists the most recent call first


def crashed_at(report_dir: str | None, rank: int) -> Activity | None:
    """Where rank `rank` was when it died, if it left a crash record."""
    if not report_dir:
        return None
    path = crash_file(Path(report_dir), rank)
    try:  # not through a link, not blocking on a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            stack = main_stack_from_dump(fh.read().decode(errors="replace"))
    except OSError:
        return None
    return _with_code(describe(stack)) if stack else None


def traceback_frames(traceback_text: str) -> list[Frame]:
    """The frames of a printed traceback, outermost first."""
    return [Frame(f, int(n), fn.strip()) for f, n, fn in _TB_FRAME.findall(traceback_text)]


def failed_at(traceback_text: str) -> Activity | None:
    """Where a rank was when it raised, from the traceback the agent recorded."""
    frames = traceback_frames(traceback_text)
    return describe(frames) if frames else None


def _with_code(act: Activity) -> Activity:
    if act.site is not None and not act.site.code and os.path.isfile(act.site.file):
        import linecache

        code = linecache.getline(act.site.file, act.site.line).strip()
        act.site = Frame(act.site.file, act.site.line, act.site.function, code)
    return act
