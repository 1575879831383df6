"""A sharded transformers model exported without gathering it: every rank writes the
shards it holds in Hugging Face's safetensors layout (DCP's `HuggingFaceStorageWriter`,
`save_distributed=True`), rank 0 consolidates them into `model-0000K-of-0000N.safetensors`
with the index and writes `config.json` beside them — the directory `from_pretrained`
reads, no conversion step, no rank holding the whole model. A tied parameter is stored
once, under its first name, as `save_pretrained` stores it.

Written, as `checkpoint.export.export_pretrained`, into a new private directory beside
`out_dir` (rank 0 makes it; every rank writes there, so the ranks must share the
filesystem: when a rank cannot see it, `run.export` gathers the weights on rank 0 as
before), then renamed into place; a failure on rank 0 is said on every rank.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch.nn as nn

from phalanx.checkpoint.export import _check_replaceable, place_directory, tied_names
from phalanx.errors import UserError
from phalanx.paths import remove_tree


def shared_directory(run: Any, out_dir: str | Path) -> str | None:
    """Rank 0's new private directory beside `out_dir`, when every rank sees it (the ranks
    share the disk); else None, the directory removed (a collective)."""
    tmp = _on_main(run, out_dir, lambda: _private_directory(Path(out_dir)))
    if all(run.gather_objects(Path(tmp).is_dir())):
        return tmp
    if run.is_main:
        remove_tree(Path(tmp))
    return None


def export_sharded_pretrained(run: Any, model: nn.Module, out_dir: str | Path,
                              tmp: str) -> Path | None:
    """`run.export` of a sharded transformers model into `tmp` (`shared_directory`), then
    renamed to `out_dir` (a collective); `out_dir` on rank 0."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    out, module = Path(out_dir), run.unwrap(model)
    state = get_model_state_dict(model)
    for alias in _aliases(module):
        state.pop(alias, None)
    try:
        dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(
            tmp, save_distributed=True, enable_consolidation=True))
        _on_main(run, out_dir, lambda: _finish(module, Path(tmp), out))
    finally:
        if run.is_main:  # (placed: gone already)
            remove_tree(Path(tmp))
    return out if run.is_main else None


def _on_main(run: Any, out_dir: str | Path, work) -> Any:
    """`work()` on rank 0, its result broadcast; its failure raised on every rank."""
    result, failure = None, None
    if run.is_main:
        try:
            result = work()
        except Exception as exc:  # said on every rank below, not left to hang them
            failure = exc
    result, said = run.broadcast((result, None if failure is None
                                  else f"{type(failure).__name__}: {failure}"))
    if failure is not None:
        raise failure
    if said is not None:
        raise UserError(f"rank 0 could not export the model to `{out_dir}`: {said}")
    return result


def _private_directory(out: Path) -> str:
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)


def _finish(module: nn.Module, tmp: Path, out: Path) -> None:
    """The configuration beside the consolidated weights; the per-rank files removed;
    the directory renamed into place."""
    module.config.save_pretrained(tmp)  # type: ignore[union-attr,operator]
    generation = getattr(module, "generation_config", None)
    if generation is not None and getattr(module, "can_generate", lambda: False)():
        generation.save_pretrained(tmp)
    remove_tree(tmp / "sharded")
    place_directory(tmp, out)


def _aliases(module: nn.Module) -> list[str]:
    """Every name of a tied parameter but its first (GPT-2's `lm_head.weight`)."""
    return [name for group in tied_names(module) for name in group[1:]]
