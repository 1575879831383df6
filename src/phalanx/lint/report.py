"""Findings as ruff-like text, JSON, or SARIF 2.1.0 (for code-scanning tools)."""

from __future__ import annotations

import json
from dataclasses import asdict

from phalanx.lint.engine import Finding, Rule
from phalanx.version import __version__

SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def text(findings: list[Finding], files: int, skipped: int = 0) -> str:
    lines = [f"{f.path}:{f.line}:{f.col}: {f.code} [{f.severity}] {f.message}\n"
             f"    fix: {f.fix}" for f in findings]
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
    summary = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n)
    not_python = f" ({skipped} skipped: not valid Python)" if skipped else ""
    lines.append(f"{files} file(s) checked{not_python}: {summary or 'no findings'}.")
    return "\n".join(lines)


def as_json(findings: list[Finding], files: int, skipped: int = 0) -> str:
    return json.dumps({"files": files, "skipped": skipped,
                       "findings": [asdict(f) for f in findings]}, indent=2)


def sarif(findings: list[Finding], rules: list[Rule]) -> str:
    driver = {"name": "phalanx-lint", "version": __version__,
              "informationUri": "https://github.com/phalanx-dev/phalanx",
              "rules": [{"id": r.code, "shortDescription": {"text": r.message},
                         "help": {"text": r.fix},
                         "defaultConfiguration": {"level": SARIF_LEVEL[r.severity]}}
                        for r in rules]}
    results = [{"ruleId": f.code, "level": SARIF_LEVEL[f.severity],
                "message": {"text": f"{f.message} Fix: {f.fix}"},
                "locations": [{"physicalLocation": {
                    "artifactLocation": {"uri": f.path},
                    "region": {"startLine": f.line, "startColumn": f.col}}}]}
               for f in findings]
    return json.dumps({"$schema": "https://json.schemastore.org/sarif-2.1.0.json",
                       "version": "2.1.0",
                       "runs": [{"tool": {"driver": driver}, "results": results}]}, indent=2)


def explain(rule: Rule) -> str:
    return (f"{rule.code} ({rule.severity}): {rule.message}\nFix: {rule.fix}\n\n"
            f"Wrong:\n{_indent(rule.wrong)}\n\nRight:\n{_indent(rule.right)}\n")


def _indent(code: str) -> str:
    return "\n".join("    " + line for line in code.splitlines())


def rules_markdown(rules: list[Rule]) -> str:
    """docs/lint-rules.md: every rule with its fix and both examples."""
    out = ["# `phalanx lint` rules", "",
           "Generated from the rules themselves (`phalanx lint --explain CODE` prints one); "
           "the examples are also the tests' fixtures. Suppress a finding on its line with "
           "`# phalanx: ignore[CODE]`.", "", "| code | severity | what |", "|---|---|---|"]
    out += [f"| [{r.code}](#{r.code.lower()}) | {r.severity} | {r.message} |" for r in rules]
    for r in rules:
        out += ["", f"## {r.code}", "", f"**{r.severity}** — {r.message}", "", f"Fix: {r.fix}",
                "", "Wrong:", "```python", r.wrong, "```", "Right:", "```python", r.right, "```"]
    return "\n".join(out) + "\n"
