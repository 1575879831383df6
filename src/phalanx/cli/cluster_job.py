"""What a job rendered by `phalanx slurm` or `phalanx k8s` runs: `phalanx train` (the
default), or — when the verb's flags are followed by `run SCRIPT [ARGS...]` — the user's
own script under `phalanx run` (each SLURM task one rank; each pod its node's launcher).

Shared by both verbs: that trailing argument and its checks (a script is named; no flag
that only `phalanx train` reads is given with it), the command line the job runs, and the
one-line form of a refused value."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass
from typing import NoReturn

from phalanx.cli import run as run_verb
from phalanx.config.flags import without_flags
from phalanx.config.sections import SECTIONS, flag_of
from phalanx.errors import UserError

RUN = "run"
_RUN_FLAGS_SAID = ("--out, --nproc-per-node, --nnodes, --rdzv-id and the other launch flags, "
                   "--threads-per-rank, --max-restarts, --strategy, --hang-timeout-s, "
                   "--debug-collectives, --tee-ranks")


class _RunParser(argparse.ArgumentParser):
    """`phalanx run`'s own parser, its refusals one line about the job's command."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"`phalanx run` would refuse the job's command line: {message}.")


def run_parser() -> argparse.ArgumentParser:
    """A parser of `phalanx run`'s command line, built by that verb itself."""
    parser = _RunParser(prog="phalanx run", allow_abbrev=False, add_help=False)
    run_verb.add_arguments(parser)
    return parser


def show(value: str) -> str:
    """`value` on one line, its line breaks and control characters escaped."""
    return repr(value)[1:-1]


def check_value(pattern: re.Pattern[str], flag: str, value: str, what: str) -> None:
    """UserError "`FLAG VALUE` is not WHAT" unless all of `value` matches `pattern`."""
    if not pattern.fullmatch(value):
        raise UserError(f"`{flag} {show(value)}` is not {what}")


def add_job_argument(parser: argparse.ArgumentParser, script_help: str) -> None:
    """The optional trailing `run SCRIPT [ARGS...]` (everything from `run` on)."""
    g = parser.add_argument_group(
        "a job that runs your own script",
        "After the flags above, `run SCRIPT [ARGS...]` makes the job run `phalanx run "
        "SCRIPT ARGS` instead of `phalanx train`. Before `run` go this verb's flags and "
        f"`phalanx run`'s ({_RUN_FLAGS_SAID}); the trainer's flags (--preset, --max-steps, "
        "--config, ...) are refused. Everything after SCRIPT goes to the script as given. "
        + script_help)
    g.add_argument("job", nargs=argparse.REMAINDER, metavar="run SCRIPT [ARGS ...]",
                   help="e.g. `run train.py --lr 3e-4`")


@dataclass(frozen=True)
class Job:
    """The job's command: `phalanx train FLAGS` (no script) or `phalanx run FLAGS SCRIPT
    ARGS`, FLAGS being the verb's command line before `run` less the verb's own flags."""

    flags: list[str]
    script: str | None = None
    args: tuple[str, ...] = ()

    def command(self, python: str, drop: dict[str, bool], last: list[str]) -> list[str]:
        """`python -m phalanx train|run ...`: `drop` ({flag: takes a value}) removed from
        the flags, `last` (e.g. `--out OUT`) after them."""
        if self.script is None:
            return [python, "-m", "phalanx", "train", *without_flags(self.flags, drop), *last]
        words = [*without_flags(self.flags, drop), *last, self.script, *self.args]
        run_parser().parse_args(words)  # what `phalanx run` will read: refused here, not there
        return [python, "-m", "phalanx", RUN, *words]


def job_of(ns: argparse.Namespace, argv: list[str], verb: str) -> Job:
    """The verb's command line `argv` read as a Job: UserError (one line) for words after
    the flags other than `run SCRIPT [ARGS...]`, for a missing script, and for trainer
    flags given with `run`."""
    words = list(getattr(ns, "job", None) or [])  # argparse left them whole, from `run` on
    flags = argv[:len(argv) - len(words)]
    words = words[1:] if words[:1] == ["--"] else words
    flags = flags[:-1] if flags[-1:] == ["--"] else flags  # wherever argparse left a `--`
    if not words:
        return Job(flags)
    usage = f"`phalanx {verb} [flags] run SCRIPT [ARGS...]`"
    if words[0] != RUN:
        raise UserError(f"unexpected `{show(words[0])}`: after its flags `phalanx {verb}` "
                        f"takes only `run SCRIPT [ARGS...]`, a job that runs your own "
                        f"script: {usage}.")
    if len(words) == 1 or not words[1].strip():
        raise UserError(f"`run` needs the script the job runs: {usage}, e.g. `phalanx {verb} "
                        f"--nodes 2 --out /shared/run1 run train.py --lr 3e-4`.")
    if words[1].startswith("-"):
        raise UserError(f"`run {show(words[1])}`: `phalanx run`'s flags go before `run`, "
                        f"with this verb's; after `run` come SCRIPT and its arguments: {usage}.")
    trainer = _trainer_flags(flags)
    if trainer:
        said = ", ".join(f"`{flag}`" for flag in trainer)
        raise UserError(f"{said}: the trainer's, not `phalanx run`'s, and this job runs your "
                        f"script (`run {show(words[1])}`); before `run` give only the "
                        f"`phalanx {verb}` flags and `phalanx run`'s ({_RUN_FLAGS_SAID}), "
                        f"and your script's own arguments after it.")
    return Job(flags, words[1], tuple(words[2:]))


def _trainer_flags(flags: list[str]) -> list[str]:
    """The flags in `flags` (as spelled there, in order) that `phalanx train` takes and
    `phalanx run` does not (`--config`, `--max-steps`, `--no-debug-collectives`, ...)."""
    trainer = {"--config"}
    for cls in SECTIONS.values():
        for f in dataclasses.fields(cls):
            flag = flag_of(f)
            trainer |= {flag, "--no-" + flag[2:]}
    trainer -= {name for action in run_parser()._actions for name in action.option_strings}
    found: list[str] = []
    for word in flags:
        name = word.split("=", 1)[0]
        if name in trainer and name not in found:
            found.append(name)
    return found


def layout_note(cfg, nodes: int, per_node: int) -> str | None:
    """What the job's layout flags make of `nodes` × `per_node` ranks, checked when the job
    is rendered rather than when it starts on the cluster: a layout the world cannot take
    is refused in one line, and a group of ranks that would span machines (the note the
    run prints at start) is returned."""
    from phalanx.config.strategy import choose

    layout = choose(cfg.dist, nodes * per_node, cfg.train.grad_accum).layout
    return layout.across_machines(per_node, nodes)
