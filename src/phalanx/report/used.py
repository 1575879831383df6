"""What the report says a run used, from what the run recorded: `environment.json` and
`run_config.json` (written by `phalanx train`), the checkpoints' manifests (written by
`run.save` too) and the metrics. An option left at its default (`None` in the config)
is shown as the value the run resolved it to when that was recorded, else as what the
default means, else "not recorded" — never as a raw `None`. A run written by a user's
own script through the library API records neither file: its loss is plain "loss"
(no unit is known), and its status is what `phalanx run` recorded in the events (it
started, ended, failed, was stopped), else not guessed."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from phalanx.paths import RunDir

NOT_RECORDED = "not recorded"

# what a `None` option means when the run did not record what it resolved to
NONE_MEANS = {
    ("data", "path"): "the default: the Python standard library's source",
    ("data", "cache_dir"): "the default: $XDG_CACHE_HOME/phalanx or ~/.cache/phalanx",
    ("dist", "nccl_preset"): "none",
}


def trainer_run(config: dict[str, Any]) -> bool:
    """Whether `phalanx train` wrote the run (its `run_config.json` is there)."""
    return isinstance(config.get("train"), dict) and isinstance(config.get("model"), dict)


def loss_unit(env: dict[str, Any], config: dict[str, Any]) -> str | None:
    """The unit the run's `loss` is in, when the run says (the trainer: nats/byte)."""
    unit = env.get("loss_unit")
    if isinstance(unit, str) and unit:
        return unit
    return "nats/byte" if trainer_run(config) else None


# the status a run's last lifecycle event (`phalanx run`'s) says
ENDED = {"start": "not finished", "end": "complete", "failure": "failed", "stop": "stopped"}


def status(run_dir: Path, config: dict[str, Any],
           events: list[dict[str, Any]] | None = None) -> str:
    """complete (the trainer's final model is written), not finished (a trainer's run
    without it: stopped, failed or still going); for a script under `phalanx run`, what
    its last start/end/failure/stop event says; else not recorded."""
    try:
        if stat.S_ISREG(os.lstat(RunDir(run_dir).model).st_mode):
            return "complete"
    except OSError:
        pass
    if trainer_run(config):
        return "not finished"
    said = [e["kind"] for e in events or () if e.get("kind") in ENDED]
    return ENDED[said[-1]] if said else NOT_RECORDED


def ranks(env: dict[str, Any], from_checkpoint: int | None) -> str:
    world = _count(env.get("world_size"))
    world = world if world is not None else from_checkpoint
    return str(world) if world is not None else NOT_RECORDED


def strategy(env: dict[str, Any]) -> str:
    name = env.get("strategy")
    return name if isinstance(name, str) and name else NOT_RECORDED


def shown_environment(env: dict[str, Any]) -> dict[str, Any]:
    return {k: NOT_RECORDED if v is None or v == "" else v for k, v in env.items()}


def shown_config(config: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    """`config`'s sections with each `None` replaced by what was used (see the module)."""
    resolved = _resolved(config, env)
    shown = {}
    for name, section in config.items():
        if not isinstance(section, dict):
            continue
        shown[name] = {key: _shown(name, key, value, resolved) for key, value in
                       section.items()}
    return shown


def _shown(section: str, key: str, value: Any, resolved: dict[tuple[str, str], str]) -> Any:
    if (section, key) == ("dist", "backend") and value == "auto":
        return resolved.get((section, key), value)
    if value is not None:
        return value
    return resolved.get((section, key)) or NONE_MEANS.get((section, key), NOT_RECORDED)


def _resolved(config: dict[str, Any], env: dict[str, Any]) -> dict[tuple[str, str], str]:
    """What the run resolved its defaults to, where it recorded that, as shown."""
    dist = found if isinstance(found := config.get("dist"), dict) else {}
    world, threads = _count(env.get("world_size")), _count(env.get("threads_per_rank"))
    hosts = env.get("hosts")
    nodes = len([h for h in hosts.split(",") if h.strip()]) if isinstance(hosts, str) else 0
    one_node = str(dist.get("nnodes")) == "1"
    nodes = nodes or (1 if one_node else 0)
    used = {}
    if world and nodes and world % nodes == 0:
        used[("dist", "nproc_per_node")] = f"{world // nodes} (default)"
    layout = any(dist.get(d) is not None for d in ("dp_replicate", "dp_shard"))
    for key, how in (("strategy", "by the layout flags" if layout else "default"),
                     ("backend", "auto")):
        if isinstance(env.get(key), str) and env[key]:
            used[("dist", key)] = f"{env[key]} ({how})"
    if threads:
        used[("dist", "threads_per_rank")] = f"{threads} (default)"
    if one_node:
        used[("dist", "node_rank")] = "0 (one machine)"
        used[("dist", "rdzv_endpoint")] = "none (one machine)"
    return used


def _count(value: Any) -> int | None:
    """`value` when it is a plausible count of ranks or threads, else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31
    return value if ok else None
