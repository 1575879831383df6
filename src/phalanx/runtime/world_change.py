"""What resuming on another world changes, said the same way by the trainer
(`train.changes`, `train.checkpointing`) and a script's `run.resume`: which world and
strategy wrote the checkpoint and which resume it, and the global batch when the number
of data-parallel ranks changes it (the per-rank batch stays what the code asks for)."""

from __future__ import annotations

from typing import Any

WORLD_KEY = "phalanx.world"  # in a checkpoint's meta: who wrote it (`world_record`)


def world_record(world_size: int, dp_size: int, strategy: str) -> dict[str, Any]:
    """What `run.save` records of the world that writes a checkpoint."""
    return {"world_size": world_size, "dp_size": dp_size, "strategy": strategy}


def written_by(then_world: Any, then_strategy: Any, world: int, strategy: str) -> str:
    """`written by 2 rank(s) with ddp, now 1 with single`."""
    return f"written by {then_world} rank(s) with {then_strategy}, now {world} with {strategy}"


def batch_change(before: int, now: int, then_ranks: int, ranks: int, per: str,
                 keep: str | None) -> list[str]:
    """The change of the global batch (`per`: its unit), when there is one; `keep`: how to
    keep `before` (None: no whole per-rank batch does)."""
    if before == now:
        return []
    return [f"the global batch is {now} {per} instead of {before} ({then_ranks} → {ranks} "
            f"ranks)" + (f"; to keep {before}, {keep}" if keep else "")]


def script_resume(meta: dict[str, Any], world: int, dp_size: int, strategy: str,
                  loader: tuple[int, int] | None) -> str:
    """What `run.resume` adds to its line: `; written by …, now …` and `; changed: …`
    ('' for a checkpoint written before its world was recorded). `loader`: the loader's
    (global batch when saved, per-rank batch now), when resumed with one."""
    then = meta.get(WORLD_KEY)
    if not isinstance(then, dict):
        return ""
    text = "; " + written_by(then.get("world_size"), then.get("strategy"), world, strategy)
    then_dp = then.get("dp_size")
    if loader is None or not isinstance(then_dp, int) or then_dp == dp_size:
        return text
    before, per_rank = loader
    keep = (f"give run.loader batch_size={before // dp_size}" if before % dp_size == 0
            else None)
    changed = batch_change(before, per_rank * dp_size, then_dp, dp_size,
                           "samples per micro-step", keep)
    return text + (f"; changed: {', '.join(changed)}" if changed else "")
