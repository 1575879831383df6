"""One job, decided once: what a Phalanx launcher settled for the run (the settings, the
run directory, the checkpoint it verified, the torchft group, the layout requested),
handed to every worker it starts as one versioned JSON file (`OUT/job.json`, its path in
`PHALANX_JOB`). A worker starts from it — it does not parse the command line again — and
decides only what belongs to its attempt (the world it joined, its rank, the strategy for
that world: `runtime.choice.choose_here`, once per process), since an elastic restart can
change the world.

Under `torchrun` or a plain `srun` there is no Phalanx launcher: each rank is its own
launcher, parses once and writes no job file."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.cluster import protocol
from phalanx.config.layout import requested
from phalanx.config.sections import Config, from_dict
from phalanx.errors import UserError
from phalanx.paths import RunDir, atomic_write, parse_json, read_regular, shown
from phalanx.version import __version__

FORMAT = 2  # the job file's layout; a change that old readers would misread bumps it


@dataclass(frozen=True)
class Job:
    """The run-wide part of a job, decided once by the launcher."""

    verb: str  # the command whose workers start from it ("train")
    config: Config
    out: Path  # the run directory, absolute
    argv: tuple[str, ...]  # the command line as given (said back in "Resume with: …")
    verified: str | None = None  # the checkpoint verified in full (resume.verified_token)
    ft_group: str | None = None  # the torchft replica group this launcher runs, if any

    @property
    def layout(self) -> dict[str, int | None]:
        """The mesh layout requested (`config.layout`: per dimension None, a size or -1
        for the rest), checked with the config; each attempt resolves it for its world."""
        return requested(self.config.dist)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "phalanx": __version__, "verb": self.verb,
            "config": self.config.to_dict(), "out": str(self.out), "argv": list(self.argv),
            "verified": self.verified, "ft_group": self.ft_group}, indent=1, sort_keys=True)


def write(job: Job, path: Path | None = None) -> Path:
    """`OUT/job.json` (or `path`), replaced atomically and without following a link (the
    caller holds the lock of the run directory it is in)."""
    return atomic_write(path or RunDir(job.out).job, job.to_json() + "\n")


def from_json(text: str | bytes, where: str) -> Job:
    """The job in `text`; a file from another format or Phalanx version, or not a job at
    all, is a UserError in one line naming `where`."""
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise UserError(f"the job file {where} is not JSON ({exc}).") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT \
            or data.get("phalanx") != __version__:
        found = data.get("phalanx") if isinstance(data, dict) else None
        raise UserError(f"the job file {where} was written by "
                        f"{'Phalanx ' + str(found) if found else 'something else'}, not by "
                        f"this Phalanx {__version__} (job format {FORMAT}): a worker starts "
                        f"only from its own launcher's job. Start the run again with one "
                        f"Phalanx version on every machine.")
    try:
        job = Job(verb=str(data["verb"]), config=from_dict(data["config"], f"the job file "
                                                           f"{where}"),
                  out=Path(data["out"]), argv=tuple(str(a) for a in data["argv"]),
                  verified=_text_or_none(data["verified"], "verified"),
                  ft_group=data["ft_group"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"the job file {where} is incomplete or malformed ({exc!r}).") from None
    return job


def _text_or_none(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be text or null, not {type(value).__name__}")
    return value


def load(path: str | os.PathLike[str]) -> Job:
    """Read the job a launcher handed this worker (regular file, no link followed)."""
    where = f"`{shown(path)}` (PHALANX_JOB)"
    data = read_regular(Path(path), where, "It is written by Phalanx's launcher; start the "
                        "run with `phalanx train`.")
    if data is None:
        raise UserError(f"the job file {where} does not exist: the launcher writes it before "
                        f"it starts the workers.")
    return from_json(data, where)


def handed_job(environ: Any = None) -> Job | None:
    """The job this process was handed by the Phalanx launcher that started it (as one of
    its ranks, or as a torchft replica group); else None."""
    environ = os.environ if environ is None else environ
    path = environ.get(protocol.JOB)
    handed = protocol.phalanx_worker(environ) or protocol.replica_group(environ) is not None
    if not path or not handed:  # a worker, or a torchft replica group's launcher
        return None
    return load(path)
