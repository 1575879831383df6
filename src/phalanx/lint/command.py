"""`phalanx lint PATH... [--format text|json|sarif] [--select/--ignore CODES] [--explain CODE]`.

Exit codes: 1 when an error-level finding remains, 0 otherwise, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from phalanx.errors import UserError
from phalanx.paths import kind, require_file

SUMMARY = "Find DDP mistakes in training scripts without running them (ast only)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories")
    parser.add_argument("--format", choices=("text", "json", "sarif"), default="text",
                        help="output format (default: text)")
    parser.add_argument("--select", default="", metavar="CODES",
                        help="only these rule codes or prefixes, comma-separated (e.g. PX3,PX101)")
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
                        help="rewrite what can be fixed without changing behaviour (PX502 "
                             "weights_only=True, PX603 torch.amp) in place, then report "
                             "what is left")
    fixing.add_argument("--diff", action="store_const", const="diff", dest="fixing",
                        help="print those fixes as a unified diff; write nothing (exit 1 "
                             "when there is one)")


def _codes(raw: str, flag: str) -> list[str]:
    from phalanx.lint.rules import ALL

    codes = [c.strip().upper() for c in raw.split(",") if c.strip()]
    for code in codes:
        if not any(rule.code.startswith(code) for rule in ALL):
            raise UserError(f"`{flag}` {code} matches no rule; rules are "
                            f"{ALL[0].code}…{ALL[-1].code} (see `phalanx lint --explain CODE`).")
    return codes


def chosen_rules(select: str, ignore: str):
    from phalanx.lint.rules import ALL

    chosen = _codes(select, "--select")
    skipped = _codes(ignore, "--ignore")
    return [r for r in ALL if (not chosen or any(r.code.startswith(c) for c in chosen))
            and not any(r.code.startswith(c) for c in skipped)]


def _fix(path: Path, source: str, rules, mode: str | None, tally: list[int]) -> str:
    """`--fix`: write the fixed file and return its source; `--diff`: print the diff."""
    from phalanx.lint.fix import diff, fixed_source

    if mode is None:
        return source
    fixed, count = fixed_source(str(path), source, rules)
    if not count:
        return source
    tally[0], tally[1] = tally[0] + count, tally[1] + 1
    if mode == "diff":
        print(diff(str(path), source, fixed), end="")
        return source
    try:
        path.write_text(fixed, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write the fixes to `{path}`: {exc.strerror}.") from None
    return fixed


def _lint_file(path: Path, rules, named: bool, mode: str | None = None,
               tally: list[int] | None = None, modules: dict | None = None):
    """The file's findings; a file that is not Python is a usage error when it was named,
    and reported (stderr) and skipped when it was found in a directory. `mode`: fix or
    diff first (`tally`: fixes, files)."""
    from phalanx.lint.engine import lint_source

    if named:
        require_file(path, "path", "Give Python files or directories to lint.")
    elif kind(path) != "a regular file":  # a FIFO named x.py would block the read
        print(f"phalanx lint: skipped `{path}`: it is {kind(path)}, not a regular file.",
              file=sys.stderr)
        return None
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read `{path}`: {getattr(exc, 'strerror', None) or exc}.") \
            from None
    try:
        return lint_source(str(path), _fix(path, source, rules, mode, tally or [0, 0]), rules,
                           modules)
    except (SyntaxError, ValueError, RecursionError) as exc:
        where = f" line {exc.lineno}" if isinstance(exc, SyntaxError) else ""
        why = exc.msg if isinstance(exc, SyntaxError) else str(exc) or type(exc).__name__
        if named:
            raise UserError(f"`{path}`{where}: not valid Python ({why}).") from None
        print(f"phalanx lint: skipped `{path}`{where}: not valid Python for this interpreter "
              f"({why}).", file=sys.stderr)
        return None


def _shown(globs: tuple[str, ...]) -> str:
    return ", ".join(globs[:4]) + (", …" if len(globs) > 4 else "") if globs else "nothing"


def run_lint(ns: argparse.Namespace, argv: list[str]) -> int:
    from phalanx.lint import report
    from phalanx.lint.files import patterns, python_files
    from phalanx.lint.project import project_collectives
    from phalanx.lint.rules import BY_CODE

    if ns.explain:
        rule = BY_CODE.get(ns.explain.upper())
        if rule is None:
            raise UserError(f"no rule `{ns.explain}`; codes: {', '.join(BY_CODE)}.")
        print(report.explain(rule))
        return 0
    if not ns.paths:
        raise UserError("give at least one file or directory to lint.")
    rules = chosen_rules(ns.select, ns.ignore)
    named = {Path(p) for p in ns.paths if not Path(p).is_dir()}
    findings, files, skipped, tally = [], 0, 0, [0, 0]
    globs = patterns(ns.exclude, ns.extend_exclude)
    paths = list(python_files(ns.paths, globs))
    modules = project_collectives(paths) if len(paths) > 1 else None
    for path in paths:
        found = _lint_file(path, rules, path in named, ns.fixing, tally, modules)
        if found is None:
            skipped += 1
            continue
        findings += found
        files += 1
    if files == 0 and skipped == 0:
        raise UserError(f"no Python file to check under {', '.join(f'`{p}`' for p in ns.paths)}"
                        f" (no `.py` file there, or every one excluded by "
                        f"{_shown(globs)}). Name a file or a directory that holds `.py` "
                        f"files, or change `--exclude`.")
    if ns.fixing == "diff":
        print(f"{tally[0]} fix(es) in {tally[1]} file(s) would be applied (`--fix` writes "
              f"them).", file=sys.stderr)
        return 1 if tally[0] else 0
    if ns.fixing == "fix":
        print(f"fixed {tally[0]} finding(s) in {tally[1]} file(s).", file=sys.stderr)
    output = {"text": lambda: report.text(findings, files, skipped),
              "json": lambda: report.as_json(findings, files, skipped),
              "sarif": lambda: report.sarif(findings, rules)}[ns.format]()
    print(output)
    return 1 if any(f.severity == "error" for f in findings) else 0
