"""A newcomer's rough edges, each kept from coming back: what the docs say matches what
the code does, and a TOML file takes values as a user writes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from phalanx import cli
from phalanx.config.flags import load_toml
from phalanx.config.sections import SECTIONS, build_config, flag_of

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# "`--flag` … (default N", "`--flag N`, default N", "`--flag` defaults to N": the flag in
# backticks (maybe with its metavar), a few words, then the stated default
STATED = re.compile(r"`(--[a-z][a-z0-9-]*)(?: [^`]*)?`[^`()|]{0,40}?"
                    r"(?:\(default:?|, default|defaults to)\s+(`?)([^\s`;,)]+)")


def _actual_defaults() -> dict[str, list]:
    """Every flag's default: the config's fields, then each verb's own flags."""
    found: dict[str, list] = {}
    for cls in SECTIONS.values():
        for f in cls.__dataclass_fields__.values():
            found.setdefault(flag_of(f), []).append(f.default)
    for parser in cli.build_parser().verb_parsers.values():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in found or action.default is not None:
                    found.setdefault(flag, []).append(action.default)
    return found


def _matches(stated: str, quoted: bool, actual) -> bool:
    if actual is None or isinstance(actual, bool):
        return True  # worked out at run time ("one per GPU"), or on/off: not a number
    if isinstance(actual, (int, float)):
        try:
            return float(stated) == float(actual)
        except ValueError:
            return not quoted  # prose ("one per core"), not a stated value
    return not quoted or stated == actual


def documented_defaults() -> list[tuple[str, str, str, bool]]:
    """(file, flag, stated default, whether in backticks) for each statement found."""
    out = []
    for doc in DOCS:
        text = re.sub(r"\s+", " ", doc.read_text(encoding="utf-8"))
        for m in STATED.finditer(text):
            if not m[3].startswith("--"):  # "default `--max-steps`": a rule, not a value
                out.append((doc.name, m[1], m[3], bool(m[2])))
    return out


def test_every_default_the_docs_state_is_the_code_s():
    stated = documented_defaults()
    flags = {flag for _, flag, _, _ in stated}
    assert {"--checkpoint-every", "--keep-checkpoints", "--hang-timeout-s",
            "--straggler-every", "--out", "--mfu"} <= flags, flags  # the parser finds them
    actual = _actual_defaults()
    wrong = [f"{doc}: `{flag}` default {value}, the code says {actual.get(flag)}"
             for doc, flag, value, quoted in stated
             if flag not in actual or not any(_matches(value, quoted, a) for a in actual[flag])]
    assert not wrong, wrong


def test_the_statement_pattern_reads_each_way_the_docs_say_it():
    text = ("`--checkpoint-every` steps (default 100) · `--timeout-s` (default 600 s) · "
            "`--out`, default `runs/default` · `--spike-factor K` (default 2; 0: off) · "
            "`--mfu` defaults to 0.4")
    assert [(m[1], m[3]) for m in STATED.finditer(text)] == [
        ("--checkpoint-every", "100"), ("--timeout-s", "600"), ("--out", "runs/default"),
        ("--spike-factor", "2"), ("--mfu", "0.4")]
    assert not _matches("100", False, 500) and _matches("500", False, 500)


def test_the_readme_says_the_loss_is_deterministic_per_machine():
    text = re.sub(r"\s+", " ", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert "1.4436 nats/byte every time" not in text
    assert "deterministic per machine" in text and "1.1237 nats/byte" in text


@pytest.mark.parametrize("toml, expected", [
    ("[dist]\nnnodes = 1\n", {"nnodes": "1"}),
    ("[dist]\nnnodes = 2\nrdzv_endpoint = '10.0.0.1:29400'\nrdzv_id = 1234\n",
     {"nnodes": "2", "rdzv_id": "1234"}),
])
def test_a_toml_number_for_a_text_field_is_taken_as_written(tmp_path, toml, expected):
    path = tmp_path / "c.toml"
    path.write_text(toml)
    dist = build_config(load_toml(str(path))).dist
    assert {k: getattr(dist, k) for k in expected} == expected
    assert dist.node_range()[1] == int(expected["nnodes"])


def test_a_toml_value_of_the_wrong_kind_is_still_refused(tmp_path):
    from phalanx.errors import UserError

    path = tmp_path / "c.toml"
    for bad, needle in (("nnodes = 2.5", "must be str"), ("nnodes = true", "must be str"),
                        ("strategy = 1", "expected one of")):
        path.write_text(f"[dist]\n{bad}\n")
        with pytest.raises(UserError, match=needle):
            load_toml(str(path))
