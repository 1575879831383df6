"""The static side of a hang or abort report: where in the job's own files the ranks can
part. A diagnosis from stacks names where the ranks *met* (the collective each one is
in); when one rank ran a collective the others skipped — a rank-0-only evaluation under
FSDP whose all-gathers match the training ones in size — the line where they *parted*
is a few lines away, and `phalanx lint` finds it without running anything (PX301: a
collective reachable only on some ranks; PX302: a DDP forward reachable only on some).

`parting_findings(files)` lints the given files (those of the ranks' stacks) as one
project, with those rules only; `citation(findings)` is the sentence a report adds.
Files that cannot be read or parsed are left out: a report never fails because of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from phalanx.lint.engine import Finding, lint_source

PARTING = ("PX301", "PX303", "PX302")  # the rules whose findings explain ranks that parted
MAX_BYTES = 2_000_000  # a report lints the stack's files, not a generated blob


def parting_findings(files: Iterable[str]) -> list[Finding]:
    """PX301/PX302 findings in `files` (regular .py files only, each once), linted as one
    project so that a helper in one file called under a rank condition in another counts."""
    from phalanx.lint.project import build_project
    from phalanx.lint.rules import BY_CODE

    paths = _readable(files)
    rules = [BY_CODE[code] for code in PARTING]
    try:
        project = build_project(paths)
    except (SyntaxError, ValueError, RecursionError, OSError):
        project = None
    found: list[Finding] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
            found += lint_source(str(path), text, rules, project)
        except (SyntaxError, ValueError, RecursionError, OSError, UnicodeDecodeError):
            continue
    return found


def _readable(files: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for name in dict.fromkeys(files):  # once each, in the order given
        path = Path(name)
        try:
            st = os.stat(path)  # a regular file: not a FIFO that would block the read
        except OSError:
            continue
        if path.suffix == ".py" and path.is_file() and st.st_size <= MAX_BYTES:
            out.append(path)
    return out


def citation(findings: list[Finding], short=str, limit: int = 2) -> str:
    """`phalanx lint` finds where the ranks part: train.py:34 (PX301): the forward of the
    FSDP model `model` … under `if rank == 0:` at line 33: …' for the first `limit`
    findings; '' when there are none. `short`: how a path is shown."""
    if not findings:
        return ""
    shown = "; ".join(f"{short(f.path)}:{f.line} ({f.code}): {_detail(f)}"
                      for f in findings[:limit])
    more = f" (and {len(findings) - limit} more)" if len(findings) > limit else ""
    from phalanx.lint.rules import OPT_IN

    opt_in = sorted({f.code for f in findings[:limit]} & OPT_IN)  # (not in a default run)
    how = f"`phalanx lint --select {','.join(opt_in)}`" if opt_in else "`phalanx lint`"
    return f"{how} finds where the ranks part: {shown}{more}."


def _detail(finding: Finding) -> str:
    """The finding's own words (what runs where, under which condition) without the
    rule's headline, or the whole message."""
    from phalanx.lint.rules import BY_CODE

    rule = BY_CODE.get(finding.code)
    text = finding.message
    if rule is not None and text.startswith(rule.message) and len(text) > len(rule.message):
        text = text[len(rule.message):].strip()
        if text.startswith("(") and text.endswith(")"):
            text = text[1:-1]
    return text.split("; not proven:")[0].rstrip(".")  # (the job itself shows it parted)
