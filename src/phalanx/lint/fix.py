"""`phalanx lint --fix / --diff`: mechanical rewrites that keep what the code does.

Only three, each the spelling torch itself documents as equivalent:
- PX603 `torch.cuda.amp.GradScaler(a, ...)` → `torch.amp.GradScaler("cuda", a, ...)`;
- PX603 `torch.cuda.amp.autocast(a, b, c)` → `torch.autocast("cuda", enabled=a, dtype=b,
  cache_enabled=c)` (positional arguments named: the order differs);
- PX502 `torch.load(f)` → `torch.load(f, weights_only=True)`, only where `weights_only`
  is not given (torch ≥ 2.6's own default; an explicit `weights_only=False` is the
  user's choice and left alone).
Each edit touches only the characters of the call it fixes; the result must parse and
no longer carry the finding, or the file is left as it was.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

from phalanx.lint.engine import Context, dotted, keyword, suppressed

AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


@dataclass(frozen=True)
class Edit:
    start: int  # character offsets into the source
    end: int
    text: str


class _Offsets:
    """ast's (line, UTF-8 byte column) → character offset into the source."""

    def __init__(self, source: str) -> None:
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def at(self, line: int, col: int) -> int:
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        return self.starts[line - 1] + len(text.encode("utf-8")[:col].decode("utf-8", "replace"))

    def start(self, node: ast.AST) -> int:
        return self.at(node.lineno, node.col_offset)

    def end(self, node: ast.AST) -> int:
        return self.at(node.end_lineno, node.end_col_offset)


def _open_paren(source: str, call: ast.Call, where: _Offsets) -> int:
    return source.index("(", where.end(call.func)) + 1


def _deprecated_amp(source: str, ctx: Context, node: ast.AST, where: _Offsets) -> list[Edit]:
    call = ctx.parents.get(node)
    if not isinstance(call, ast.Call) or call.func is not node:
        return []
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


def _weights_only(source: str, ctx: Context, node: ast.AST, where: _Offsets) -> list[Edit]:
    if not isinstance(node, ast.Call) or keyword(node, "weights_only") is not None or any(
            k.arg is None for k in node.keywords):
        return []
    paren, close = _open_paren(source, node, where), where.end(node) - 1  # after `(`, at `)`
    inside = source[paren:close].rstrip()
    text = "weights_only=True" if inside.endswith(",") or not inside else ", weights_only=True"
    at = paren + len(inside)
    return [Edit(at, at, (" " if inside.endswith(",") else "") + text)]


FIXERS = {"PX603": _deprecated_amp, "PX502": _weights_only}


def fixed_source(path: str, source: str, rules) -> tuple[str, int]:
    """The source with every fixable finding of `rules` fixed, and how many were."""
    ctx, where = Context(path, source), _Offsets(source)
    edits: list[Edit] = []
    count = 0
    for rule in rules:
        fixer = FIXERS.get(rule.code)
        if fixer is None:
            continue
        for node, _ in rule.check(ctx):
            if suppressed(ctx, getattr(node, "lineno", 1), rule.code):
                continue
            found = fixer(source, ctx, node, where)
            edits += found
            count += bool(found)
    if not edits:
        return source, 0
    out = source
    # from the end, so offsets stay valid; at one offset, the edit listed first ends first
    for _, edit in sorted(enumerate(edits), key=lambda ie: (ie[1].start, ie[1].end, ie[0]),
                          reverse=True):
        out = out[:edit.start] + edit.text + out[edit.end:]
    ast.parse(out, filename=path)  # a fix that does not parse is a bug: raise, write nothing
    return out, count


def diff(path: str, before: str, after: str) -> str:
    old, new = (path, path) if path.startswith("/") else (f"a/{path}", f"b/{path}")
    return "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                        after.splitlines(keepends=True), old, new))
