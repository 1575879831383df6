"""Where this process runs: which launcher started it, its ranks, the usable cores.

Reads environment variables only (no torch import), so the CLI can decide whether to
launch workers or be one without paying for `import torch`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from phalanx.cluster import slurm_env
from phalanx.cluster.protocol import LAUNCHED, srun_task
from phalanx.errors import UserError


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    launcher: str  # "phalanx", "torchrun", "slurm" or "none"
    rendezvous: tuple[tuple[str, str], ...] = ()  # variables to set if unset (srun: MASTER_*)


def usable_cores() -> int:
    """CPU cores this process may run on (affinity-aware, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def has_ranks(environ: Mapping[str, str] | None = None) -> bool:
    """Whether torchrun-style RANK and WORLD_SIZE are set (torchrun, Phalanx's agent, or
    `phalanx run` having set them under srun)."""
    e = os.environ if environ is None else environ
    return "RANK" in e and "WORLD_SIZE" in e


def global_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's global rank as its launcher set it, without checking the rest
    (`detect_launch_env` does): RANK, else SLURM_PROCID, else 0 (no launcher); None when
    the variable is not an integer. For deciding who speaks or writes before (or
    without) `phalanx.init` — the one reader of these variables outside cluster/."""
    return _lenient(environ, "RANK", "SLURM_PROCID")


def local_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """LOCAL_RANK, else SLURM_LOCALID, else 0; None when not an integer."""
    return _lenient(environ, "LOCAL_RANK", "SLURM_LOCALID")


def launched_world(environ: Mapping[str, str] | None = None) -> int | None:
    """WORLD_SIZE as the launcher set it, else 1; None when not an integer."""
    e = os.environ if environ is None else environ
    return _lenient(e, "WORLD_SIZE") if "WORLD_SIZE" in e else 1


def _lenient(environ: Mapping[str, str] | None, *names: str) -> int | None:
    e = os.environ if environ is None else environ
    value = next((e[n] for n in names if n in e), "0")
    try:
        return int(value)
    except ValueError:
        return None


def _int(environ: dict, name: str, default: int | None = None) -> int:
    value = environ.get(name)
    if value is None:
        if default is None:
            raise UserError(f"launcher environment incomplete: `{name}` is not set.")
        return default
    try:
        return int(value)
    except ValueError:
        raise UserError(f"launcher environment variable `{name}` is `{value}`, "
                        f"expected an integer.") from None


def detect_launch_env(environ: dict | None = None) -> LaunchEnv:
    """Ranks from torchrun-style variables, else SLURM's, else a 1-process world."""
    e = dict(os.environ if environ is None else environ)
    if "RANK" in e and "WORLD_SIZE" in e:
        launcher = "phalanx" if e.get(LAUNCHED) else (
            "torchrun" if "TORCHELASTIC_RUN_ID" in e else "env")
        env = LaunchEnv(_int(e, "RANK"), _int(e, "LOCAL_RANK", 0), _int(e, "WORLD_SIZE"),
                        _int(e, "LOCAL_WORLD_SIZE", _int(e, "WORLD_SIZE")), launcher)
    elif srun_task(e):
        env = _slurm(e)
    else:
        return LaunchEnv(0, 0, 1, 1, "none")
    if not 0 <= env.rank < env.world_size or not 0 <= env.local_rank < env.local_world_size:
        raise UserError(f"launcher environment is inconsistent: RANK={env.rank}, "
                        f"LOCAL_RANK={env.local_rank}, WORLD_SIZE={env.world_size}, "
                        f"LOCAL_WORLD_SIZE={env.local_world_size}; expected 0 <= RANK < "
                        f"WORLD_SIZE and 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE.")
    return env


def _slurm(e: dict) -> LaunchEnv:
    """Ranks of an srun task: SLURM_PROCID / LOCALID / STEP_NUM_TASKS, this node's task
    count from SLURM_STEP_TASKS_PER_NODE, and MASTER_ADDR/PORT when srun set none."""

    world = _int(e, "SLURM_STEP_NUM_TASKS", _int(e, "SLURM_NTASKS", 1))
    per_node = slurm_env.tasks_per_node(e.get("SLURM_STEP_TASKS_PER_NODE")
                                        or e.get("SLURM_TASKS_PER_NODE") or str(world))
    node = _int(e, "SLURM_NODEID", 0)
    local_world = per_node[node] if node < len(per_node) else per_node[-1]
    meet = {} if "MASTER_ADDR" in e and "MASTER_PORT" in e else slurm_env.rendezvous(e)
    return LaunchEnv(_int(e, "SLURM_PROCID"), _int(e, "SLURM_LOCALID", 0), world, local_world,
                     "slurm", tuple(meet.items()))
