"""A user's own stateful loader in `run.save(loader=...)` / `run.resume(loader=...)`:
anything with `state_dict()` and `load_state_dict()` that is not Phalanx's `run.loader` —
torchdata's `StatefulDataLoader` (workers included), or a user's iterator.

Each rank's loader reads its own share of the data, so each rank's state is its own: every
rank's is gathered into the checkpoint's meta (JSON: tensors in it, e.g. a sampler's
generator state, as tagged lists of their values), and on resume each rank loads the state
of the rank it was. That is exact at the same world size. At another world size there is
no rank to take a state from — a user's loader cannot say how its position maps onto
another split of the data — so it is refused in one line that says what re-splits exactly:
Phalanx's own `run.loader`, whose state is one global cursor.
"""

from __future__ import annotations

from typing import Any

import torch

from phalanx.errors import UserError

KEY = "phalanx.user_loader"  # in a checkpoint's meta: {"world": W, "ranks": [state, ...]}
_TENSOR = "__phalanx_tensor__"


def is_user_loader(loader: Any) -> bool:
    """A loader with a state that is not Phalanx's own (`run.loader`: it has `position`)."""
    return callable(getattr(loader, "state_dict", None)) and \
        callable(getattr(loader, "load_state_dict", None)) and not hasattr(loader, "position")


def record(run: Any, loader: Any) -> dict[str, Any]:
    """Every rank's loader state (a collective: `run.save` calls it on every rank)."""
    return {"world": run.world_size, "ranks": run.gather_objects(_plain(loader.state_dict()))}


def restore(run: Any, loader: Any, saved: Any, where: str) -> None:
    """This rank's saved state into `loader`; another world size refused in one line."""
    if not isinstance(saved, dict) or not isinstance(saved.get("ranks"), list):
        raise UserError(f"{where} holds a malformed loader state; resume without `loader=` "
                        f"to start the data over knowingly.")
    world = saved.get("world")
    if world != run.world_size or len(saved["ranks"]) != run.world_size:
        raise UserError(f"{where} holds the states of {world} ranks' own loaders ("
                        f"{type(loader).__name__}), and this run has {run.world_size}: each "
                        f"rank's position belongs to its share of the data, which another "
                        f"world size splits differently. Resume at {world} ranks, or use "
                        f"run.loader(...), whose one global cursor re-splits exactly.")
    loader.load_state_dict(_tensors(saved["ranks"][run.rank]))


def _plain(value: Any) -> Any:
    """`value` with every tensor as a tagged JSON-able list (dtype, shape, values)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return {_TENSOR: str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                "values": t.reshape(-1).tolist()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise UserError(f"run.save(loader=...): the loader's state holds a "
                    f"{type(value).__name__}, which a checkpoint's meta cannot store (it "
                    f"takes tensors, numbers, text, lists and dicts).")


def _tensors(value: Any) -> Any:
    """`_plain` undone."""
    if isinstance(value, dict) and _TENSOR in value:
        dtype = getattr(torch, str(value[_TENSOR]), None)
        if not isinstance(dtype, torch.dtype):
            raise UserError(f"a loader state in the checkpoint names `{value[_TENSOR]}`, "
                            f"which is not a torch dtype: the checkpoint was edited or "
                            f"damaged.")
        return torch.tensor(value["values"], dtype=dtype).reshape(value["shape"])
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensors(v) for v in value]
    return value
