"""`phalanx lint PATH... [--format text|json|sarif] [--select/--ignore CODES] [--explain CODE]`.

Every rule runs except the opt-in ones (`rules.OPT_IN`), which run only when `--select`
names them by code or prefix, or with `--select ALL`.

Exit codes: 1 when an error-level finding remains, 0 otherwise, 2 for usage errors.
With `--diff`: 1 when there is a fix to apply. With `--fix`: also 1 when a file changed
while it was being fixed (it is left as it is), 3 when a fix would not parse (a bug in
Phalanx; no file is written).

A file that cannot be read, is not a regular file or is not valid Python is a usage
error when it was named (no file is written), and skipped with a line on stderr when it
was found in a directory (the other files are fixed). Every file's fix is decided (and
re-parsed) before any file is written.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from phalanx.errors import UserError
from phalanx.paths import kind, require_file

if TYPE_CHECKING:
    from phalanx.lint.fix import Fix

SUMMARY = "Find DDP mistakes in training scripts without running them (ast only)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from phalanx.lint.rules import OPT_IN

    opt_in = ", ".join(sorted(OPT_IN)) or "none"
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories")
    parser.add_argument("--format", choices=("text", "json", "sarif"), default="text",
                        help="output format (default: text)")
    parser.add_argument("--select", default="", metavar="CODES",
                        help="only these rule codes or prefixes, comma-separated (e.g. "
                             "PX3,PX101); `ALL`: every rule; `seeds`: every rule that "
                             "finds one of the field guides' pitfalls, opt-in ones included "
                             "(docs/lint-seeds.md). Without it every rule runs "
                             f"except the opt-in ones ({opt_in}), which run only when "
                             "selected (by code, prefix, profile or ALL)")
    parser.add_argument("--ignore", default="", metavar="CODES",
                        help="skip these rule codes or prefixes, comma-separated")
    parser.add_argument("--explain", metavar="CODE", help="print a rule's documentation")
    parser.add_argument("--exclude", default=None, metavar="GLOBS",
                        help="folders/files not to check under a named directory, "
                             "comma-separated globs matched against each name and its path "
                             "below the directory; replaces the defaults (.git, .venv, venv, "
                             "__pycache__, site-packages, caches, node_modules, …)")
    parser.add_argument("--extend-exclude", default="", metavar="GLOBS",
                        help="more exclusions, added to the defaults or to --exclude")
    fixing = parser.add_mutually_exclusive_group()
    fixing.add_argument("--fix", action="store_const", const="fix", dest="fixing",
                        help="rewrite what can be fixed without changing behaviour (PX603: "
                             "torch.cuda.amp → torch.amp), each file "
                             "replaced atomically and only once every file's fix parses, then "
                             "report what is left")
    fixing.add_argument("--diff", action="store_const", const="diff", dest="fixing",
                        help="print those fixes as a unified diff; write nothing (exit 1 "
                             "when there is one)")


def _codes(raw: str, flag: str) -> list[str]:
    """The codes or prefixes `raw` names; a profile (`seeds`: lint.profiles) by its codes."""
    from phalanx.lint.profiles import PROFILES
    from phalanx.lint.rules import ALL

    codes = []
    for code in (c.strip().upper() for c in raw.split(",") if c.strip()):
        if code in PROFILES:
            codes += sorted(PROFILES[code])
        elif code == "ALL" and flag == "--select" or \
                any(rule.code.startswith(code) for rule in ALL):
            codes.append(code)
        else:
            raise UserError(f"`{flag}` {code} matches no rule; rules are "
                            f"{ALL[0].code}…{ALL[-1].code}, or a profile: "
                            f"{', '.join(p.lower() for p in PROFILES)} (see `phalanx lint "
                            f"--explain CODE`).")
    return codes


def chosen_rules(select: str, ignore: str):
    """The rules to run: those `select` names (codes or prefixes; `ALL`: every rule) or,
    without it, every rule but the opt-in ones; minus those `ignore` names."""
    from phalanx.lint.rules import ALL, OPT_IN

    chosen = _codes(select, "--select")
    skipped = _codes(ignore, "--ignore")

    def selected(code: str) -> bool:
        if not chosen:
            return code not in OPT_IN
        return "ALL" in chosen or any(code.startswith(c) for c in chosen)

    return [r for r in ALL if selected(r.code)
            and not any(r.code.startswith(c) for c in skipped)]


def _left_out(rules) -> dict[str, str]:
    """The opt-in rules a default run left out (not those `--ignore` named), with why."""
    from phalanx.lint.rules import OPT_IN, STANDING

    ran = {r.code for r in rules}
    return {code: STANDING[code][1] for code in sorted(OPT_IN) if code not in ran}


def _skip(path: Path, why: str) -> None:
    print(f"phalanx lint: skipped `{path}`{why}.", file=sys.stderr)


def _read(path: Path, named: bool):
    """The file's bytes and text (fix.Source), decoded as Python decodes them. A file that
    cannot be read is a usage error when it was named, and reported (stderr) and skipped
    (None) when it was found in a directory."""
    from phalanx.lint.fix import Unreadable, read_source

    if named:
        require_file(path, "path", "Give Python files or directories to lint.")
    elif kind(path) != "a regular file":  # a FIFO named x.py would block the read
        return _skip(path, f": it is {kind(path)}, not a regular file")
    try:
        return read_source(path)
    except OSError as exc:
        why = exc.strerror or str(exc)
    except Unreadable as exc:
        why = str(exc)
    if named:
        raise UserError(f"cannot read `{path}`: {why}.")
    return _skip(path, f": cannot read it ({why})")


@dataclass
class _Checked:
    path: Path
    fix: Fix | None  # with --fix/--diff, when something in the file can be fixed
    findings: list  # of the fixed text, when there is a fix
    lines: int = 0  # source lines checked


def _check(path: Path, rules, named: bool, mode: str | None, modules) -> _Checked | None:
    """Read, fix (`mode`: fix or diff; nothing is written here) and lint one file; None
    when it is skipped (said on stderr). A file that is not Python is a usage error when
    it was named, and skipped when it was found in a directory. FixBroke: a fix of
    Phalanx's own that would not parse."""
    from phalanx.lint.engine import lint_source
    from phalanx.lint.fix import NotFixable, fix_file

    source = _read(path, named)
    if source is None:
        return None
    try:
        fix = None
        if mode is not None:
            try:
                fix = fix_file(path, source, rules)
            except NotFixable as exc:
                print(f"phalanx lint: {exc}", file=sys.stderr)
        fix = fix if fix is not None and fix.count else None
        text = fix.text if fix is not None else source.text
        return _Checked(path, fix, lint_source(str(path), text, rules, modules),
                        len(text.splitlines()))
    except (SyntaxError, ValueError, RecursionError) as exc:
        where = f" line {exc.lineno}" if isinstance(exc, SyntaxError) else ""
        why = exc.msg if isinstance(exc, SyntaxError) else str(exc) or type(exc).__name__
        if named:
            raise UserError(f"`{path}`{where}: not valid Python ({why}).") from None
        _skip(path, f"{where}: not valid Python for this interpreter ({why})")
        return None


def _show_or_write(checked: list[_Checked], mode: str | None, rules, modules) -> int:
    """Show (`diff`) or write (`fix`) every file's fixes, once all were decided; the exit
    code this asks for (1: a diff to apply, or a file that changed meanwhile)."""
    from phalanx.lint.engine import lint_source
    from phalanx.lint.fix import diff, distinct, write_fixes

    fixes = distinct([c.fix for c in checked if c.fix is not None])
    if mode == "diff":
        for fix in fixes:
            print(diff(str(fix.path), fix.source.text, fix.text), end="")
        print(f"{sum(f.count for f in fixes)} fix(es) in {len(fixes)} file(s) would be "
              f"applied (`--fix` writes them).", file=sys.stderr)
        return 1 if fixes else 0
    if mode != "fix":
        return 0
    written, changed = write_fixes(fixes)
    for fix in changed:
        print(f"phalanx lint: `{fix.path}` changed while it was being fixed; left as it is "
              f"now (not fixed). Run `phalanx lint --fix` again.", file=sys.stderr)
        for c in checked:  # report what was read, not the fix that was not written
            if c.fix is not None and os.path.realpath(c.path) == os.path.realpath(fix.path):
                c.fix, c.findings = None, lint_source(str(c.path), fix.source.text, rules,
                                                      modules)
    print(f"fixed {sum(f.count for f in written)} finding(s) in {len(written)} file(s).",
          file=sys.stderr)
    return 1 if changed else 0


def _shown(globs: tuple[str, ...]) -> str:
    return ", ".join(globs[:4]) + (", …" if len(globs) > 4 else "") if globs else "nothing"


def run_lint(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.lint import output as report
    from phalanx.lint.engine import collector_paused
    from phalanx.lint.files import patterns, python_files
    from phalanx.lint.fix import FixBroke
    from phalanx.lint.project import build_project
    from phalanx.lint.rules import BY_CODE

    if ns.explain:
        rule = BY_CODE.get(ns.explain.upper())
        if rule is None:
            raise UserError(f"no rule `{ns.explain}`; codes: {', '.join(BY_CODE)}.")
        print(report.explain(rule))
        return 0
    if not ns.paths:
        raise UserError("give at least one file or directory to lint.")
    started = time.perf_counter()
    rules = chosen_rules(ns.select, ns.ignore)
    named = {Path(p) for p in ns.paths if not Path(p).is_dir()}
    globs = patterns(ns.exclude, ns.extend_exclude)
    paths = list(python_files(ns.paths, globs))
    try:  # every file read, checked and its fix decided before any file is written
        with collector_paused():
            modules = build_project(paths)
            checked = [_check(path, rules, path in named, ns.fixing, modules) for path in paths]
    except FixBroke as exc:
        print(f"phalanx lint: {exc}", file=sys.stderr)
        return 3
    found = [c for c in checked if c is not None]
    if not checked:
        raise UserError(f"no Python file to check under {', '.join(f'`{p}`' for p in ns.paths)}"
                        f" (no `.py` file there, or every one excluded by "
                        f"{_shown(globs)}). Name a file or a directory that holds `.py` "
                        f"files, or change `--exclude`.")
    code = _show_or_write(found, ns.fixing, rules, modules)
    if ns.fixing == "diff":
        return code
    findings = [f for c in found for f in c.findings]
    run = report.Run(files=len(found), lines=sum(c.lines for c in found),
                     seconds=time.perf_counter() - started,
                     skipped=len(checked) - len(found), rules=rules,
                     opt_in={} if ns.select else _left_out(rules))
    output = {"text": lambda: report.text(findings, run),
              "json": lambda: report.as_json(findings, run),
              "sarif": lambda: report.sarif(findings, rules)}[ns.format]()
    print(output)
    return max(code, 1 if any(f.severity == "error" for f in findings) else 0)
