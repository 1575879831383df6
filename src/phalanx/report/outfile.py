"""Writing the report page: checked and its temporary file created before the page is
built (a directory, a missing or unwritable parent is said at once), then renamed over
the page's path, so a reader never sees half a page. The temporary file is created
exclusively beside the page (`mkstemp`: O_EXCL, never through a link planted under its
name) and removed on any failure; the rename replaces a link at the page's path instead
of writing through it. Every failure is the user's to fix and says where to write
instead."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from phalanx.errors import UserError
from phalanx.paths import current_umask


class PageFile:
    """`with PageFile(path, run_dir, given) as page: ...; page.commit(text)`: `given`
    says whether the user chose `path` (`--out`), for the fix the errors suggest."""

    def __init__(self, path: Path, run_dir: Path, given: bool) -> None:
        self.path, self.run_dir, self.given = Path(path), Path(run_dir), given
        self._fd: int | None = None
        self._tmp: str | None = None

    def __enter__(self) -> PageFile:
        self._check()
        try:
            self._fd, self._tmp = tempfile.mkstemp(dir=self.path.parent,
                                                   prefix=f".{self.path.name}.", suffix=".tmp")
        except OSError as exc:
            raise self._cannot(exc) from None
        return self

    def commit(self, text: str) -> Path:
        """Write the page and rename it into place; return its path."""
        assert self._fd is not None and self._tmp is not None, "commit outside `with`"
        fd, self._fd = self._fd, None
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), 0o666 & ~current_umask())  # as `open` would make it
                fh.write(text.encode("utf-8"))
            os.replace(self._tmp, self.path)
        except OSError as exc:
            raise self._cannot(exc) from None
        self._tmp = None
        return self.path

    def __exit__(self, *exc_info) -> None:
        if self._fd is not None:
            os.close(self._fd)
        if self._tmp is not None:  # not committed: nothing is left behind
            _unlink(self._tmp)

    def _check(self) -> None:
        path, parent = self.path, self.path.parent
        if path.is_dir():
            fix = (f"Name the file, e.g. `--out {path / 'report.html'}`." if self.given else
                   f"Move that directory away, or {self._elsewhere()}.")
            raise UserError(f"`{path}` is a directory; expected a file to write the report "
                            f"page to. {fix}")
        if parent.is_dir():
            return
        if os.path.lexists(parent):
            raise UserError(f"`{parent}` is not a directory, so `{path}` cannot be written; "
                            f"expected a directory there. {_first_up(self._elsewhere())}.")
        raise UserError(f"the directory `{parent}` does not exist, so `{path}` cannot be "
                        f"written; expected an existing directory. Create it (`mkdir -p "
                        f"{parent}`) or {self._elsewhere()}.")

    def _cannot(self, exc: OSError) -> UserError:
        return UserError(f"cannot write the report page `{self.path}` into `{self.path.parent}` "
                         f"({exc.strerror or exc}); expected a directory you can write to. "
                         f"{_first_up(self._elsewhere())}.")

    def _elsewhere(self) -> str:
        return ("give `--out` a file in a directory you can write to" if self.given else
                f"write the page elsewhere: `phalanx report {self.run_dir} --out FILE`")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _first_up(text: str) -> str:
    return text[:1].upper() + text[1:]


