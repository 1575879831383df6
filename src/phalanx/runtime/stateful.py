"""A script's other state in its checkpoints: `run.save(..., stateful={"scheduler": s})`
and `run.resume(..., stateful=...)` — each object's `state_dict()` kept in the
checkpoint's JSON sidecar beside the data position and the loss scaler, and given back to
its `load_state_dict()` on resume (an LR scheduler, an EMA's step counter, a curriculum).

JSON, not a pickle: loading a checkpoint must not run code it holds (docs/security.md), so
a state dict that JSON cannot hold (tensors aside: they become lists) is refused at save,
naming the entry, rather than found unreadable at resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from phalanx.checkpoint.saver import jsonable
from phalanx.errors import UserError

KEY = "phalanx.stateful"  # in a checkpoint's meta: {name: that object's state_dict()}


def record(stateful: dict[str, Any] | None) -> dict[str, Any]:
    """{KEY: {name: state dict}} for `run.save`'s meta; {} without `stateful`."""
    if stateful is None:
        return {}
    _check(stateful, "run.save")
    states = {}
    for name, obj in stateful.items():
        state = obj.state_dict()
        try:
            json.dumps(state, default=jsonable)
        except (TypeError, ValueError) as exc:
            raise UserError(f"run.save(stateful=...): `{name}`'s state_dict() is not JSON "
                            f"({exc}). Phalanx keeps this state in the checkpoint as JSON, "
                            f"never pickled; keep tensors in the model or the optimizer, "
                            f"or pass an object whose state_dict() holds numbers, strings, "
                            f"lists and dicts.") from None
        states[name] = state
    return {KEY: states}


def restore(stateful: dict[str, Any] | None, meta: dict[str, Any], path: Path,
            say) -> None:
    """Each object's state from the checkpoint at `path` (its `meta`); an object the
    checkpoint holds no state for is said (`say`) and left as it is."""
    if not stateful:
        return
    _check(stateful, "run.resume")
    saved = meta.get(KEY) or {}
    missing = [name for name in stateful if name not in saved]
    if missing:
        say(f"phalanx: checkpoint `{path}` holds no state for "
            f"{', '.join(f'`{n}`' for n in missing)} (it was saved without them in "
            f"`stateful=`): they go on from their state now, not the checkpoint's")
    for name, obj in stateful.items():
        if name in saved:
            obj.load_state_dict(saved[name])


def _check(stateful: Any, verb: str) -> None:
    if not isinstance(stateful, dict) or not all(isinstance(k, str) for k in stateful):
        raise UserError(f"{verb}(stateful=...) takes {{name: object}}, e.g. "
                        f"{{'scheduler': scheduler}}; got {type(stateful).__name__}.")
    for name, obj in stateful.items():
        if not (callable(getattr(obj, "state_dict", None))
                and callable(getattr(obj, "load_state_dict", None))):
            raise UserError(f"{verb}(stateful={{'{name}': ...}}): a {type(obj).__name__} "
                            f"has no state_dict() and load_state_dict(); pass objects that "
                            f"have both (an LR scheduler, a torchdata loader, your own "
                            f"class with the two methods).")
