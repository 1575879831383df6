"""The README's `$ phalanx …` output blocks are the commands' output: each command that
takes seconds is run as shown and its output compared, line for line (a time in seconds
excepted). Blocks from long runs are listed in MEASURED; their structure is checked by
the tests that make such a run (test_train_cli.py: the `wrote:` list; test_doctor.py: the
checks and the count line)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from phalanx import cli
from readme_blocks import commands  # noqa: E402

ROOT = Path(__file__).parents[2]
# the files a README command names, as the README says what they are
FILES = {"train.py": ROOT / "tests" / "lint_seeds" / "seed002_block08.py"}
# `$ phalanx train …` lines that train for minutes: their output is a measured run's
MEASURED = [["train", "--max-steps", "400", "--lr-decay-steps", "800"],
            ["train", "--max-steps", "800", "--lr-decay-steps", "800"]]
SECONDS = re.compile(r"\b\d+(\.\d+)? s\b")


def cheap() -> list[tuple[list[str], list[str]]]:
    return [(argv, out) for argv, out in commands() if argv not in MEASURED]


def test_every_command_block_is_run_or_listed_as_measured():
    argvs = [argv for argv, _ in commands()]
    assert all(m in argvs for m in MEASURED)  # no stale entry
    assert len(cheap()) >= 2, argvs


@pytest.mark.parametrize("argv,shown", cheap(), ids=[" ".join(a) for a, _ in cheap()])
def test_a_readme_command_prints_what_the_readme_shows(tmp_path, monkeypatch, capsys,
                                                       argv, shown):
    for name in set(argv) & FILES.keys():
        shutil.copy(FILES[name], tmp_path / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    cli.main(argv)
    said = capsys.readouterr()
    got = (said.out + said.err).rstrip("\n").splitlines()
    assert [SECONDS.sub("T s", x) for x in got] == [SECONDS.sub("T s", x) for x in shown]
