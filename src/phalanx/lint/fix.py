"""`phalanx lint --fix / --diff`: mechanical rewrites that keep what the code does.

Only two, each the spelling torch itself documents as equivalent:
- PX603 `torch.cuda.amp.GradScaler(a, ...)` → `torch.amp.GradScaler("cuda", a, ...)`;
- PX603 `torch.cuda.amp.autocast(a, b, c)` → `torch.autocast("cuda", enabled=a, dtype=b,
  cache_enabled=c)` (positional arguments named: the order differs).
PX502 (`torch.load(..., weights_only=False)`) is not fixed: the file may hold objects
that only load that way, so dropping it is the user's decision.
A file is read as Python reads it (its bytes decoded by its BOM or `coding:` cookie;
lines split on \r\n, \r and \n only, as the tokenizer does — not on \f, \x85 or
\u2028, which `str.splitlines` also splits on). Each edit touches only the characters
of the call it fixes, and the fixed text is encoded back the same way, so every other
byte (newlines, BOM, encoding) is unchanged; the bytes to write must parse again, or
nothing is written (`FixBroke`: a Phalanx bug). Writing (`write_fixes`) is atomic.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import errno
import io
import os
import re
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

from phalanx.errors import StorageFull, UserError
from phalanx.lint.engine import SUPPRESS, Context, dotted

AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # the tokenizer's line ends, and no others


class Unreadable(Exception):
    """The bytes are not Python source text (bad encoding cookie, bytes not in it)."""


class FixBroke(Exception):
    """A fix made text that does not parse: a bug in Phalanx. Nothing may be written."""

    def __init__(self, path: str, codes: list[str], exc: BaseException,
                 what: str = "would not parse") -> None:
        where = f"line {exc.lineno}: " if isinstance(exc, SyntaxError) and exc.lineno else ""
        why = getattr(exc, "msg", None) or f"{type(exc).__name__}: {exc}"
        super().__init__(f"bug: the {'/'.join(codes)} fix of `{path}` {what} ({where}{why}); "
                         f"no file was written. Please report it to Phalanx with that file.")


class NotFixable(Exception):
    """The file cannot be rewritten byte for byte; it is left unfixed (said once)."""


@dataclass(frozen=True)
class Source:
    """A file's bytes, and its text decoded as Python decodes it."""

    raw: bytes
    text: str
    encoding: str  # as tokenize.detect_encoding names it: `utf-8-sig` when there is a BOM


def decode(raw: bytes) -> Source:
    """The text Python reads from `raw`: the encoding of its BOM or `coding:` cookie
    (UTF-8 without either), newlines untouched. Unreadable when Python could not."""
    hint = ("Python reads source as UTF-8 unless a `# -*- coding: NAME -*-` line names "
            "another encoding")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        why = str(exc.msg or exc)
        if why.startswith("invalid or missing"):
            why = f"its first lines are not UTF-8 text; {hint}"
        elif why.startswith("encoding problem"):
            why = "it starts with a UTF-8 BOM, but its `coding:` line names another encoding"
        raise Unreadable(why) from None
    try:
        return Source(raw, raw.decode(encoding), encoding)
    except UnicodeDecodeError as exc:
        utf8 = encoding.startswith("utf-8")
        raise Unreadable(f"byte {exc.start} (0x{raw[exc.start]:02x}) is not "
                         f"{'UTF-8' if utf8 else encoding} text" + (f"; {hint}" if utf8 else "")
                         ) from None


def read_source(path: Path) -> Source:
    with open(path, "rb") as f:
        return decode(f.read())


def ast_lines(text: str) -> list[str]:
    """`text`'s lines as ast numbers them, each with its own line end."""
    lines, start = [], 0
    for end in LINE_BREAK.finditer(text):
        lines.append(text[start:end.end()])
        start = end.end()
    if start < len(text):
        lines.append(text[start:])
    return lines


@dataclass(frozen=True)
class Edit:
    start: int  # character offsets into the source
    end: int
    text: str


class _Offsets:
    """ast's (line, UTF-8 byte column) → character offset into the source."""

    def __init__(self, source: str) -> None:
        self.lines = ast_lines(source)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col: int) -> int:
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return self.starts[line - 1] + len(text.encode("utf-8")[:col].decode("utf-8", "replace"))

    def start(self, node: ast.expr) -> int:
        return self.at(node.lineno, node.col_offset)

    def end(self, node: ast.expr) -> int:
        assert node.end_lineno is not None and node.end_col_offset is not None  # ast.parse's
        return self.at(node.end_lineno, node.end_col_offset)

    def suppressed(self, line: int, code: str) -> bool:
        """`# phalanx: ignore[CODE]` on ast's line `line` (engine.suppressed's rule)."""
        found = SUPPRESS.search(self.lines[line - 1]) if 0 < line <= len(self.lines) else None
        return found is not None and code in {c.strip() for c in found[1].split(",")}


def _open_paren(source: str, call: ast.Call, where: _Offsets) -> int:
    return source.index("(", where.end(call.func)) + 1


def _deprecated_amp(source: str, ctx: Context, node: ast.AST, where: _Offsets) -> list[Edit]:
    call = ctx.parents.get(node)
    if not isinstance(call, ast.Call) or call.func is not node:
        return []
    assert isinstance(node, ast.expr)  # it is call.func
    after = '"cuda", ' if call.args or call.keywords else '"cuda"'
    paren = _open_paren(source, call, where)
    if dotted(node) == "torch.cuda.amp.GradScaler":
        return [Edit(where.start(node), where.end(node), "torch.amp.GradScaler"),
                Edit(paren, paren, after)]
    if len(call.args) > len(AUTOCAST_POSITIONAL) or any(
            isinstance(a, ast.Starred) for a in call.args):
        return []  # not a call this fix can name argument by argument
    edits = [Edit(where.start(node), where.end(node), "torch.autocast"),
             Edit(paren, paren, after)]
    for arg, name in zip(call.args, AUTOCAST_POSITIONAL):
        edits.append(Edit(where.start(arg), where.start(arg), f"{name}="))
    return edits


FIXERS = {"PX603": _deprecated_amp}


@dataclass(frozen=True)
class Fix:
    """What `--fix` would write to one file, decided before any file is written."""

    path: Path
    source: Source
    text: str  # the fixed text (the source's text when nothing is fixed)
    raw: bytes  # the bytes to write: the fixed text in the source's encoding
    count: int  # findings fixed


def _edits(path: str, source: str, rules) -> tuple[list[Edit], list[str], int]:
    """Every edit of `rules`' fixable findings, the codes they fix, and how many."""
    ctx, where = Context(path, source), _Offsets(source)
    edits: list[Edit] = []
    codes, count = [], 0
    for rule in rules:
        fixer = FIXERS.get(rule.code)
        if fixer is None:
            continue
        for item in rule.check(ctx):
            node = item[0]
            if where.suppressed(getattr(node, "lineno", 1), rule.code):
                continue
            try:
                found = fixer(source, ctx, node, where)
            except (ValueError, IndexError) as exc:  # e.g. no `(` where ast put the call
                raise FixBroke(path, [rule.code], exc, "failed") from None
            edits += found
            count += bool(found)
            codes += [rule.code] if found and rule.code not in codes else []
    return edits, codes, count


def _apply(source: str, edits: list[Edit]) -> str:
    out = source
    # from the end, so offsets stay valid; at one offset, the edit listed first ends first
    for _, edit in sorted(enumerate(edits), key=lambda ie: (ie[1].start, ie[1].end, ie[0]),
                          reverse=True):
        out = out[:edit.start] + edit.text + out[edit.end:]
    return out


def fix_file(path: Path, source: Source, rules) -> Fix:
    """The file with every fixable finding of `rules` fixed. SyntaxError (…) when the
    source does not parse; NotFixable when its bytes would not survive being written
    back; FixBroke when the fixed bytes do not parse."""
    edits, codes, count = _edits(str(path), source.text, rules)
    if not edits:
        return Fix(path, source, source.text, source.raw, 0)
    text = _apply(source.text, edits)
    try:
        same = source.text.encode(source.encoding) == source.raw
        raw = text.encode(source.encoding)
    except UnicodeError:
        same = False
    if not same:
        raise NotFixable(f"`{path}` is left unfixed: its {source.encoding} text would not be "
                         f"written back byte for byte; fix it by hand.")
    try:
        ast.parse(raw, filename=str(path))  # the bytes, as Python will read them
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise FixBroke(str(path), codes, exc) from None
    return Fix(path, source, text, raw, count)


def diff(path: str, before: str, after: str) -> str:
    r"""A unified diff of exactly the text `--fix` writes: its own line ends kept (so a
    CRLF file's lines end in \r\n), and the last line marked when it has none."""
    old, new = (path, path) if path.startswith("/") else (f"a/{path}", f"b/{path}")
    out = []
    for line in difflib.unified_diff(ast_lines(before), ast_lines(after), old, new):
        out.append(line if line.endswith(("\n", "\r")) else
                   line + "\n\\ No newline at end of file\n")
    return "".join(out)


def distinct(fixes: list[Fix]) -> list[Fix]:
    """One fix per file: a file named twice, or also through a link, is written once."""
    first = {os.path.realpath(f.path): f for f in reversed(fixes)}
    return [f for f in fixes if first[os.path.realpath(f.path)] is f]


def _write_temp(fix: Fix) -> str:
    """The fixed bytes in a new file beside the real one (a link's target), with the
    original's permission bits (and owner, where allowed), flushed to disk."""
    real = os.path.realpath(fix.path)
    if not os.access(real, os.W_OK):  # a read-only file stays read-only, as it always did
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(fix.path))
    info = os.stat(real)
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".phalanx-fix",
                                dir=os.path.dirname(real))
    try:
        try:
            view = memoryview(fix.raw)
            while view:
                view = view[os.write(fd, view):]
            os.fchmod(fd, stat.S_IMODE(info.st_mode))
            with contextlib.suppress(OSError):  # only root may give a file to another user
                os.fchown(fd, info.st_uid, info.st_gid)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _remove(temp)
        raise
    return temp


def _remove(temp: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(temp)


def _unchanged(fix: Fix) -> bool:
    """The file still holds the bytes that were read, checked and fixed."""
    try:
        with open(os.path.realpath(fix.path), "rb") as f:
            return f.read() == fix.source.raw
    except OSError:
        return False


def _write_error(fix: Fix, exc: OSError, done: int) -> UserError:
    why = exc.strerror or os.strerror(exc.errno or 0) or str(exc)
    kept = (f"{done} other file(s) were fixed before it; `{fix.path}` is unchanged"
            if done else "no file was changed")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return StorageFull(f"cannot write the fixes to `{fix.path}`: {why} ({kept}). Free "
                           f"space or make it writable, then run again.")
    return UserError(f"cannot write the fixes to `{fix.path}`: {why} ({kept}). `--fix` "
                     f"writes a temporary file in the same folder and moves it over the "
                     f"file, so both must be writable.")


def write_fixes(fixes: list[Fix]) -> tuple[list[Fix], list[Fix]]:
    """Replace each file with its fixed bytes, atomically: the fixes written, and those
    not written because their file changed while it was being fixed. Every fixed copy is
    written and flushed first, so a full disk changes no file (UserError, exit 2)."""
    temps: list[tuple[Fix, str]] = []
    try:
        for fix in distinct(fixes):
            try:
                temps.append((fix, _write_temp(fix)))
            except OSError as exc:
                raise _write_error(fix, exc, 0) from None
        return _replace_all(temps)
    finally:  # whatever stopped the run (an error, Ctrl-C), no temporary file is left
        for _, temp in temps:
            _remove(temp)  # (one moved over its file is no longer there)


def _replace_all(temps: list[tuple[Fix, str]]) -> tuple[list[Fix], list[Fix]]:
    written: list[Fix] = []
    changed: list[Fix] = []
    for fix, temp in temps:
        if not _unchanged(fix):  # checked last, to lose no edit saved meanwhile
            changed.append(fix)
            continue
        try:
            os.replace(temp, os.path.realpath(fix.path))
        except OSError as exc:
            raise _write_error(fix, exc, len(written)) from None
        written.append(fix)
    for folder in {os.path.dirname(os.path.realpath(f.path)) for f, _ in temps}:
        _sync_folder(folder)
    return written, changed


def _sync_folder(folder: str) -> None:
    """Make the renames durable (best effort: not every file system allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
