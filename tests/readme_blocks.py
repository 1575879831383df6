"""The README's output blocks, read for the tests that regenerate or check them
(tests/e2e/test_readme_outputs.py, test_doctor.py, test_train_cli.py)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def text_blocks() -> list[str]:
    """Every ```text block of the README, in order."""
    return re.findall(r"```text\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def commands() -> list[tuple[list[str], list[str]]]:
    """Every `$ phalanx …` line of a text block with the output lines under it (up to the
    next `$` line): (argv after `phalanx`, output lines). A `# comment` is dropped."""
    found = []
    for block in text_blocks():
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            first, *output = part.rstrip("\n").split("\n")
            words = first.split("#")[0].split()
            if words and words[0] == "phalanx":
                found.append((words[1:], output))
    return found


def block_with(line: str) -> str:
    """The one text block holding a line that starts with `line`."""
    [found] = [b for b in text_blocks() if any(x.startswith(line) for x in b.splitlines())]
    return found


def doctor_checks() -> tuple[list[str], str]:
    """The README's doctor table: its checks' names, in order (a name wrapped over
    several rows joined), and its last line."""
    block = block_with("┏━")
    names: list[str] = []
    for line in block.splitlines():
        if line.startswith("└"):  # the checks' table ends (the bandwidth table follows)
            break
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells[2]:  # a status: a new check
            names.append(cells[1])
        elif cells[1]:
            names[-1] += " " + cells[1]
    return names, block.rstrip("\n").splitlines()[-1]


def wrote(block_start: str = "phalanx: 2 rank(s)") -> list[str]:
    """The names in the `wrote:` line of the `phalanx train` block (after `runs/default/`)."""
    line = next(x for x in block_with(block_start).splitlines() if x.startswith("wrote: "))
    return [w.removeprefix("runs/default/") for w in line.removeprefix("wrote: ").split(", ")]
