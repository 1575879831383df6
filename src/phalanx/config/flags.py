"""Config sections ↔ command line and TOML: flags generated from the dataclass fields.

Each field becomes one flag (`--n-layer`, `--data`, ...), documented with its default;
booleans get `--x/--no-x`. A TOML file has one table per section (`[model]`, `[data]`,
`[train]`, `[dist]`); unknown keys and wrongly typed values are refused by name.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import math
import os
import sys
import typing
from typing import Any

from phalanx.config.operator import operator_dist
from phalanx.config.sections import SECTIONS, Config, DistConfig, build_config, flag_of
from phalanx.errors import UserError
from phalanx.paths import require_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """`cls`'s resolved annotations, once per class (resolving them per field made building
    the command line take half a second)."""
    return typing.get_type_hints(cls)


def _field_type(cls: type, f: dataclasses.Field) -> type:
    hint = _hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def add_config_flags(parser: argparse.ArgumentParser, hide: tuple[str, ...] = ()) -> None:
    """Add one flag per config field, grouped by section, all defaulting to 'not given'.
    The fields in `hide` (`section.field`: they mean nothing to the verb) are accepted —
    a `phalanx train` command line still works — but not listed in --help."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML file with [model], [data], [train], [dist] tables; "
                             "flags given on the command line override it.")
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} options")
        for f in dataclasses.fields(cls):
            _add_field(group, section, cls, f, hidden=f"{section}.{f.name}" in hide)


# What only a training run to its end uses (its length and schedule, evaluation, logging,
# checkpoints, the sample, resume, NaN/spike/straggler handling): verbs that time or plan
# a few steps (bench, plan) accept these — a `phalanx train` command line works — but do
# not list them in --help.
TRAINING_RUN_ONLY = (
    "train.max_steps", "train.min_lr", "train.warmup_steps", "train.lr_decay_steps",
    "train.on_nan", "train.nan_patience", "train.spike_factor", "train.eval_every",
    "train.eval_batches", "train.log_every", "train.compile", "train.sample_tokens",
    "train.checkpoint_every", "train.keep_checkpoints", "train.async_checkpoint",
    "train.resume", "train.profile_steps", "train.trackers", "train.memory_history",
    "dist.hang_timeout_s", "dist.tee_ranks",
    "dist.check_consistency_every", "model.init_from",
    "dist.straggler_every", "dist.fault_tolerance", "dist.lighthouse", "dist.min_replicas",
    "dist.ft_join_timeout_s")


LAUNCH_FIELDS = ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_id",
                 "rdzv_timeout_s", "nccl_preset")


def add_launch_flags(parser: argparse.ArgumentParser, extra: tuple[str, ...] = ()) -> None:
    """The `[dist]` flags that say where ranks run (`--nproc-per-node`, `--nnodes`, …),
    for verbs without a training config (doctor, watch); read back with `dist_config`."""

    group = parser.add_argument_group("launch options")
    for f in dataclasses.fields(DistConfig):
        if f.name in LAUNCH_FIELDS + extra:
            _add_field(group, "dist", DistConfig, f)


def _add_field(group, section: str, cls: type, f: dataclasses.Field,
               hidden: bool = False) -> None:
    kind = _field_type(cls, f)
    default = "auto" if f.default is None else f.default
    said = "(default:" in f.metadata["help"] or "by default" in f.metadata["help"]
    help_text = (f.metadata["help"] if said else
                 f"{f.metadata['help']} (default: {default})").replace("%", "%%")
    if hidden:
        help_text = argparse.SUPPRESS
    dest = f"{section}.{f.name}"
    if kind is bool:
        group.add_argument(flag_of(f), dest=dest, default=None, help=help_text,
                           action=argparse.BooleanOptionalAction)
    else:
        metavar = f.metadata.get("metavar") or {int: "N", float: "X"}.get(kind, "STR")
        group.add_argument(flag_of(f), dest=dest, default=None, type=kind,
                           choices=f.metadata.get("choices"), help=help_text,
                           metavar=None if f.metadata.get("choices") else metavar)


def cli_overrides(ns: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The config values given explicitly on the command line, per section."""
    out: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for dest, value in vars(ns).items():
        if "." in dest and value is not None:
            section, key = dest.split(".", 1)
            out[section][key] = value
    return out


def load_toml(path: str) -> dict[str, dict[str, Any]]:
    """Read and check a TOML config file: known sections, known keys, right types."""
    file = require_file(path, "config file (`--config`)", "Give the path of a TOML file.")
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"config file `{path}` cannot be read: {exc.strerror}.") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"config file `{path}` is not valid TOML: {exc}. "
                        f"Fix the line it names; see `phalanx train --help` for keys.") from None
    out: dict[str, dict[str, Any]] = {}
    for section, table in data.items():
        if section not in SECTIONS:
            raise UserError(_unknown_section(path, section, table))
        if not isinstance(table, dict):
            raise UserError(f"`{section}` in `{path}` must be a table (`[{section}]`), "
                            f"got a {type(table).__name__}.")
        out[section] = dict(_check_key(path, section, k, v) for k, v in table.items())
    return out


def _unknown_section(path: str, name: str, value: Any) -> str:
    """`[trian]` → did you mean `[train]`; a top-level `max_steps = 10` → which table
    it belongs under."""
    tables = ", ".join(f"[{s}]" for s in SECTIONS)
    if not isinstance(value, dict):
        owner = next((s for s, cls in SECTIONS.items() if name.replace("-", "_") in
                      {f.name for f in dataclasses.fields(cls)}), None)
        where = f"it belongs under `[{owner}]`: put `[{owner}]` on a line before it" \
            if owner else f"every key belongs to a table: {tables}"
        return f"`{name}` in `{path}` is outside any table; {where}."
    close = difflib.get_close_matches(name, list(SECTIONS), n=1)
    hint = f"did you mean `[{close[0]}]`? " if close else ""
    return f"unknown section `[{name}]` in `{path}`; {hint}expected one of: {tables}."


def _check_key(path: str, section: str, key: str, value: Any) -> tuple[str, Any]:
    """(field name, value) of one TOML entry, or a UserError naming it. A whole number
    for a text field (`nnodes = 2`, `rdzv_id = 1234`) is taken as its digits, as the
    same value given on the command line is."""
    cls = SECTIONS[section]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    name = key.replace("-", "_")
    if name not in fields:
        raise UserError(f"unknown key `{key}` in `[{section}]` of `{path}`; "
                        f"{_suggest(name, fields)}valid keys are: {', '.join(fields)}.")
    kind = _field_type(cls, fields[name])
    if kind is str and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        raise UserError(f"`{section}.{key}` in `{path}` must be {kind.__name__}, "
                        f"got {value!r} ({type(value).__name__}).")
    choices = fields[name].metadata.get("choices")
    if choices and value not in choices:
        raise UserError(f"`{section}.{key}` in `{path}` is {value!r}; expected one of: "
                        f"{', '.join(choices)}.")
    return name, value


def _suggest(word: str, options: Any) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f"did you mean `{close[0]}`? " if close else ""


def resolve(ns: argparse.Namespace) -> Config:
    """Kubeflow operator's variables (in a PyTorchJob pod), then the TOML file (if any),
    then the command-line flags, validated once."""
    merged: dict[str, dict[str, Any]] = {"dist": operator_dist(dict(os.environ))}
    for section, values in (load_toml(ns.config) if getattr(ns, "config", None) else
                            {}).items():
        merged.setdefault(section, {}).update(values)
    for section, values in cli_overrides(ns).items():
        merged.setdefault(section, {}).update(values)
    try:
        return build_config(merged)
    except TypeError as exc:  # a TOML value of the wrong shape reaching a dataclass
        raise UserError(f"invalid configuration: {exc}") from None


def dist_config(ns: argparse.Namespace):
    """The `[dist]` section from `add_launch_flags`' flags (and a PyTorchJob pod's
    variables), validated."""
    return resolve(ns).dist


def count(low: int = 1, high: int = 4096):
    """An argparse `type=` for an integer in [low, high] (ranks, repeats, steps)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value
    return parse


def seconds(text: str) -> float:
    """An argparse `type=` for a finite, positive number of seconds (at most 30 days)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or not 0 < value <= 30 * 24 * 3600:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds > 0 (at most "
                                         f"30 days), got {text}")
    return value


def without_flags(argv: list[str], flags: dict[str, bool]) -> list[str]:
    """`argv` minus the given flags (`{flag: takes a value}`), in both `--f V` and `--f=V`
    forms: e.g. a verb's own flags, before the rest goes to `phalanx train`."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in flags:
            skip = flags[name] and "=" not in arg
            continue
        out.append(arg)
    return out
