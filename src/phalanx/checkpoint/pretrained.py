"""Hugging Face checkpoints in: the weights of a local `save_pretrained` directory
(`*.safetensors`, one file or an index of shards) loaded straight into a model already set
up by `run.setup` — under any strategy: DCP's `HuggingFaceStorageReader` reads, on each
rank, only the slices that rank holds (FSDP: its shards), so no rank builds the whole
state dict first.

Keys are the model's own names (`get_model_state_dict`: DDP's `module.` prefix and
torch.compile's wrapper left out). A parameter tied to another (GPT-2's `lm_head.weight`
is `transformer.wte.weight`) is absent from the files, as `save_pretrained` drops it: it
is loaded through its twin. Any other parameter missing from the files, or a file tensor
of another shape, is refused in one line naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
import torch.nn as nn

from phalanx.errors import UserError


def load_pretrained(model: nn.Module, path: str | Path) -> list[str]:
    """Fill `model` (as `run.setup` returned it) from the Hugging Face directory `path`; a
    collective (every rank calls it). Returns the names loaded through a tied twin."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    reader, stored = hf_reader(path)
    # (typed as any state-dict value by torch; a module's state dict holds tensors)
    state = cast(dict[str, torch.Tensor], get_model_state_dict(model))
    tied = _tied_twins(state, stored)
    missing = [k for k in state if k not in stored and k not in tied]
    if missing:
        raise UserError(f"`{path}` has no tensor `{missing[0]}`"
                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                        + f": its names are e.g. {', '.join(sorted(stored)[:3])}. Build the "
                        f"model class and configuration that wrote it.")
    wanted = {k: v for k, v in state.items() if k not in tied}
    bad = mismatched(wanted, stored)
    if bad:
        name, size = bad
        raise UserError(f"`{path}`'s `{name}` is {size}, the model's is "
                        f"{tuple(wanted[name].shape)}: another configuration wrote it.")
    dcp.load(wanted, storage_reader=reader)
    set_model_state_dict(model, dict(wanted), options=StateDictOptions(strict=False))
    return sorted(tied)


def hf_reader(path: str | Path) -> tuple[Any, dict]:
    """DCP's reader of the Hugging Face directory `path`, and its tensors' metadata by
    name; a UserError when it holds no *.safetensors."""
    import torch.distributed.checkpoint as dcp

    where = Path(path)
    if not where.is_dir() or not any(where.glob("*.safetensors")):
        raise UserError(f"`{path}` is not a Hugging Face model directory: no *.safetensors "
                        f"file in it (write one with save_pretrained(DIR)).")
    reader = dcp.HuggingFaceStorageReader(str(where))
    return reader, reader.read_metadata().state_dict_metadata


def mismatched(wanted: dict[str, torch.Tensor], stored: dict) -> tuple[str, Any] | None:
    """The first of `wanted`'s names the files lack (with None) or hold at another size
    (with that size); None when all match."""
    for name, value in wanted.items():
        if name not in stored:
            return name, None
        size = tuple(getattr(stored[name], "size", ()) or ())
        if size != tuple(value.shape):
            return name, size
    return None


def _tied_twins(state: dict[str, torch.Tensor], stored: dict) -> set[str]:
    """Names absent from the files whose tensor is another name's that the files hold."""
    by_storage: dict[int, list[str]] = {}
    for name, value in state.items():
        local = value.to_local() if hasattr(value, "to_local") else value
        by_storage.setdefault(id(local) if local.numel() == 0 else local.data_ptr(),
                              []).append(name)
    tied = set()
    for names in by_storage.values():
        if len(names) > 1 and any(n in stored for n in names):
            tied |= {n for n in names if n not in stored}
    return tied
