"""Findings as ruff-like text, JSON, or SARIF 2.1.0 (for code-scanning tools)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from phalanx.lint.engine import SEVERITIES, Finding, Rule
from phalanx.version import __version__

SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


@dataclass(frozen=True)
class Run:
    """What one `phalanx lint` run checked: files, source lines, wall time, files
    skipped as not valid Python, and the rules that ran."""

    files: int
    lines: int = 0
    seconds: float = 0.0
    skipped: int = 0
    rules: list[Rule] = field(default_factory=list)
    opt_in: dict[str, str] = field(default_factory=dict)  # not run by default: code → why


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 or word == 'info' else 's'}"


def _related(f: Finding) -> tuple[int, ...]:
    return tuple(getattr(f, "related", ()) or ())


def summary(findings: list[Finding], run: Run) -> str:
    """`3 files, 120 lines in 0.04 s: 1 error, 2 warnings, 1 info (1 skipped: not valid
    Python)` — or `…: no findings`."""
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    found = f"{_plural(counts['error'], 'error')}, {_plural(counts['warning'], 'warning')}" \
        + (f", {counts['info']} info" if counts["info"] else "")
    not_python = f" ({run.skipped} skipped: not valid Python)" if run.skipped else ""
    return (f"{_plural(run.files, 'file')}, {_plural(run.lines, 'line')} in "
            f"{run.seconds:.2f} s: {found if findings else 'no findings'}{not_python}")


def text(findings: list[Finding], run: Run) -> str:
    """Ruff-like lines, a fix hint under each, and one summary line. (A finding's other
    lines of the same root cause are in its message already, as the rule wrote it.)"""
    lines = [f"{f.path}:{f.line}:{f.col}: {f.code} [{f.severity}] {f.message}\n"
             f"    fix: {f.fix}" for f in findings]
    lines.append(summary(findings, run))
    if run.opt_in:
        lines.append(opt_in_line(run.opt_in))
    return "\n".join(lines)


def opt_in_line(codes: Iterable[str]) -> str:
    """The rules a default run left out, each with its held-out evidence (right/judged)."""
    from phalanx.lint.rules.evidence import HELD_OUT, MANUAL

    def short(code: str) -> str:
        right, false = HELD_OUT.get(code, (0, 0))
        return "by design" if code in MANUAL else f"{right}/{right + false} right"
    listed = ", ".join(f"{code} {short(code)}" for code in sorted(codes))
    return (f"opt-in, for their precision on code Phalanx was not tuned on: {listed} "
            f"(`--select CODE` or `--select ALL` runs them; `--explain CODE` says why)")


def as_json(findings: list[Finding], run: Run) -> str:
    """The findings, the run's size and time, and every rule that ran with its count."""
    severity = {r.code: r.severity for r in run.rules} | {f.code: f.severity for f in findings}
    counts = Counter(f.code for f in findings)
    rules = {code: {"severity": severity[code], "count": counts[code]}
             for code in sorted(severity)}
    return json.dumps({"files": run.files, "lines": run.lines,
                       "seconds": round(run.seconds, 3), "skipped": run.skipped,
                       "rules": rules, "opt_in": run.opt_in,
                       "findings": [asdict(f) for f in findings]}, indent=2)


def _sarif_result(f: Finding) -> dict:
    def location(line: int, col: int) -> dict:
        return {"physicalLocation": {"artifactLocation": {"uri": f.path},
                                     "region": {"startLine": line, "startColumn": col}}}

    result = {"ruleId": f.code, "level": SARIF_LEVEL[f.severity],
              "message": {"text": f"{f.message} Fix: {f.fix}"},
              "locations": [location(f.line, f.col)]}
    if _related(f):
        result["relatedLocations"] = [
            {"id": i, **location(line, 1), "message": {"text": "same root cause"}}
            for i, line in enumerate(_related(f), 1)]
    return result


def sarif(findings: list[Finding], rules: list[Rule]) -> str:
    driver = {"name": "phalanx-lint", "version": __version__,
              "informationUri": "https://github.com/phalanx-dev/phalanx",
              "rules": [{"id": r.code, "shortDescription": {"text": r.message},
                         "help": {"text": r.fix},
                         "defaultConfiguration": {"level": SARIF_LEVEL[r.severity]}}
                        for r in rules]}
    return json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json",
                       "version": "2.1.0",
                       "runs": [{"tool": {"driver": driver},
                                 "results": [_sarif_result(f) for f in findings]}]}, indent=2)


def explain(rule: Rule) -> str:
    from phalanx.lint.rules import STANDING

    return (f"{rule.code} ({rule.severity}): {rule.message}\nFix: {rule.fix}\n"
            f"By default: {STANDING[rule.code][1]}\n\n"
            f"Wrong:\n{_indent(rule.wrong)}\n\nRight:\n{_indent(rule.right)}\n")


def _indent(code: str) -> str:
    return "\n".join("    " + line for line in code.splitlines())


def rules_markdown(rules: list[Rule]) -> str:
    """docs/lint-rules.md: every rule with its fix and both examples."""
    from phalanx.lint.rules import STANDING

    out = ["# `phalanx lint` rules", "",
           "Generated from the rules themselves (`phalanx lint --explain CODE` prints one); "
           "the examples are also the tests' fixtures. Suppress a finding on its line with "
           "`# phalanx: ignore[CODE]`. \"By default\" is whether a plain `phalanx lint` runs "
           "the rule, from its precision on code Phalanx was not tuned on "
           "(`src/phalanx/lint/rules/evidence.py`).", "",
           "| code | severity | by default | what |", "|---|---|---|---|"]
    out += [f"| [{r.code}](#{r.code.lower()}) | {r.severity} | {STANDING[r.code][1]} | "
            f"{r.message} |" for r in rules]
    for r in rules:
        out += ["", f"## {r.code}", "", f"**{r.severity}** — {r.message}", "", f"Fix: {r.fix}",
                "", "Wrong:", "```python", r.wrong, "```", "Right:", "```python", r.right, "```"]
    return "\n".join(out) + "\n"
