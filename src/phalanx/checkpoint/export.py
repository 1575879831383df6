"""Consolidated weights as safetensors + a plain `config.json`, loadable without Phalanx.

MiniGPT (`export_weights`): when the output head is tied to the token embedding (the
default) only `wte.weight` is stored and `config.json` says `"tie_word_embeddings": true`;
`load_minigpt` re-ties on load; an untied head (`--no-tie-embeddings`) is stored too. A `--model` factory's module (`export_weights` too): its
own state dict's names, and the factory with its keywords in `config.json`. Any other model (`export_pretrained`, behind
`run.export`): written the way its own library loads it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from phalanx.errors import UserError, storage_errors
from phalanx.models import GPTConfig, MiniGPT
from phalanx.models.adapter import factory_record, user_class
from phalanx.paths import atomic_write, current_umask, remove_tree, replacing

TIED = "lm_head.weight"


def export_weights(model: nn.Module, out_dir: Path, extra: dict[str, Any] | None = None,
                   filename: str = "model.safetensors") -> Path:
    """Write `out_dir/filename` and `out_dir/config.json`; returns the weights' path.

    MiniGPT: `wte.weight` once (the head is tied to it). A `--model` factory's module:
    every name of its `state_dict()` (a tied parameter's names each hold a copy), so
    `factory(**config["factory_kwargs"]).load_state_dict(load_file(path))` loads it;
    config.json records the factory."""
    record = factory_record(model)
    if record is None:
        assert isinstance(model, MiniGPT), type(model)  # the trainer's two kinds of model
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                 if k != TIED or not model.config.tie_embeddings}
        config = {"model_type": "minigpt", **dataclasses.asdict(model.config),
                  "tie_word_embeddings": model.config.tie_embeddings}
    else:
        state = _own_copies(model.state_dict())
        config = {"model_type": "phalanx-factory", **record}
    return write_weights(Path(out_dir), filename, state,
                         {**config, "tokenizer": "bytes", **(extra or {})})


def write_weights(folder: Path, filename: str, state: dict[str, torch.Tensor],
                  config: dict[str, Any]) -> Path:
    """`folder/filename` (safetensors) and `folder/config.json`; the weights' path. Each
    written beside and renamed into place: a link at either name is replaced, never
    written through; safetensors creates its file 0600, `replacing` gives it the umask's."""
    path = folder / filename
    with replacing(path) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    atomic_write(folder / "config.json", json.dumps(config, indent=2))
    return path


def _own_copies(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """On the CPU, contiguous, and no two sharing memory (safetensors refuses that: a
    tied parameter's second name gets a copy)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state.items():
        t = tensor.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen and t.numel() else t
        seen.add(ptr)
    return out


def load_minigpt(out_dir: Path, device: str | torch.device = "cpu",
                 filename: str = "model.safetensors") -> MiniGPT:
    config = json.loads((Path(out_dir) / "config.json").read_text())
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    model = MiniGPT(GPTConfig(**{k: v for k, v in config.items() if k in fields}))
    missing, unexpected = model.load_state_dict(
        load_file(str(Path(out_dir) / filename), device=str(device)), strict=False)
    if set(missing) - ({TIED} if model.config.tie_embeddings else set()) or unexpected:
        raise ValueError(f"weights do not match config.json: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.to(device)


# -- any model: written the way its library loads it back ---------------------------------
PLAIN_CONFIG = "phalanx_model.json"  # beside model.safetensors, for a module with no library


def export_pretrained(module: nn.Module, state_dict: dict[str, torch.Tensor],
                      out_dir: str | Path) -> Path:
    """Write `state_dict` (the whole weights of `module`, e.g. `run.full_state_dict`) to the
    directory `out_dir`, as `module`'s library loads it back; returns `out_dir`.

    A module with `save_pretrained` (a transformers `PreTrainedModel`) writes its own files
    (`model.safetensors`, `config.json`): `AutoModel*.from_pretrained(out_dir)` loads them.
    Any other module: `model.safetensors` (a tied parameter once, under its first name) and
    `phalanx_model.json` naming its class and the tied names; load with
    `module.load_state_dict(safetensors.torch.load_file(...), strict=False)`.

    Written into a new directory beside `out_dir`, then renamed into place: readers see
    the previous export or this one, never a mix. An existing `out_dir` is replaced only
    when it holds nothing but an export's files (else: `UserError`, nothing changed).
    """
    out = Path(out_dir)
    _check_replaceable(out)
    state = _tie({k: v.detach().cpu() for k, v in state_dict.items()}, module)
    save = getattr(module, "save_pretrained", None)
    with storage_errors(out.parent), _new_directory(out) as tmp:
        if callable(save):
            save(tmp, state_dict=state)
        else:
            _save_plain(module, state, tmp)
    return out


def tied_names(module: nn.Module) -> list[list[str]]:
    """The names of each tied parameter, first name first (GPT-2's `[transformer.wte.weight,
    lm_head.weight]`); a parameter with one name is left out."""
    names: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _tie(state: dict[str, torch.Tensor], module: nn.Module) -> dict[str, torch.Tensor]:
    """The names of one tied parameter share one tensor (a sharded model's gathered state
    holds a copy per name): the library writing it then stores it once."""
    for group in tied_names(module):
        present = [n for n in group if n in state]
        for alias in present[1:]:
            if not torch.equal(state[alias], state[present[0]]):
                raise ValueError(f"`{alias}` and `{present[0]}` are one (tied) parameter of "
                                 f"{type(module).__name__}, but the state dict holds "
                                 f"different values for them; pass the state dict of this "
                                 f"module (run.full_state_dict(model)).")
            state[alias] = state[present[0]]
    return state


def _save_plain(module: nn.Module, state: dict[str, torch.Tensor], out: Path) -> None:
    kept: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    first_of: dict[int, str] = {}
    storages: set[int] = set()
    for name, tensor in state.items():
        if id(tensor) in first_of:  # a tied alias (see _tie)
            tied[name] = first_of[id(tensor)]
            continue
        first_of[id(tensor)] = name
        storage = tensor.untyped_storage().data_ptr()
        # safetensors refuses tensors that share memory: views of one another get copies
        kept[name] = tensor.clone() if storage in storages else tensor.contiguous()
        storages.add(storage)
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    cls = _user_class(module)
    (out / PLAIN_CONFIG).write_text(json.dumps(
        {"class": f"{cls.__module__}.{cls.__qualname__}", "weights": "model.safetensors",
         "tied": tied}, indent=2) + "\n")


def _user_class(module: nn.Module) -> type:
    """The user's class of `module` (FSDP2 swaps in a subclass named FSDP<class>)."""
    from torch.distributed.fsdp import FSDPModule

    cls = user_class(module)  # an adapted `--model` factory's module: the user's class
    if issubclass(cls, FSDPModule):
        cls = next(b for b in cls.__bases__ if b is not FSDPModule)
    return cls


# -- a model `phalanx export` can rebuild from a checkpoint alone ------------------------
MODEL_KEY = "phalanx.model"  # in a script's checkpoint meta (run.save): how to rebuild it


def model_recipe(module: nn.Module) -> dict[str, Any] | None:
    """How `phalanx export` rebuilds `module` from its checkpoint alone: a transformers
    model's class and config (JSON). None for a module of no library Phalanx knows (its
    script exports it with `run.export`)."""
    cls = _user_class(module)
    config = getattr(module, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not cls.__module__.startswith("transformers.") or to_dict is None:
        return None
    return {"library": "transformers", "class": cls.__name__, "config": to_dict()}


def build_from_recipe(recipe: dict[str, Any], where: str) -> nn.Module:
    """A fresh module from `model_recipe`'s record (weights to be loaded into it)."""
    if recipe.get("library") != "transformers":
        raise UserError(f"{where} names a model of library {recipe.get('library')!r}; "
                        f"`phalanx export` rebuilds transformers models only.")
    try:
        import transformers
    except ImportError:
        raise UserError(f"{where} holds a transformers model ({recipe.get('class')}), and "
                        f"transformers is not installed here: pip install transformers.") \
            from None
    cls = getattr(transformers, str(recipe.get("class")), None)
    if cls is None or not hasattr(cls, "config_class"):
        raise UserError(f"{where} names transformers class {recipe.get('class')!r}, which "
                        f"this transformers ({transformers.__version__}) does not have.")
    return cls(cls.config_class.from_dict(recipe["config"]))


# what an export writes (transformers' files included): a directory holding only these
# may be replaced by a new export; anything else in it is the user's and is kept
_EXPORT_FILES = re.compile(r"(config|generation_config|phalanx_model)\.json|"
                           r"model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json")


def _check_replaceable(out: Path) -> None:
    if out.is_symlink() or not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"`{out}` is a file; an export is a directory. Pass a directory "
                        f"that does not exist yet (or a previous export, to replace it).")
    foreign = sorted(p.name for p in out.iterdir() if not _EXPORT_FILES.fullmatch(p.name))
    if foreign:
        listed = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
        raise UserError(f"`{out}` holds files an export does not write ({listed}), and an "
                        f"export replaces its directory whole. Pass a new directory, or "
                        f"move those files away.")


@contextlib.contextmanager
def _new_directory(out: Path):
    """A private directory beside `out` to write into; on success it gets the umask's
    permissions and replaces `out` (a link there is replaced, never followed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        place_directory(tmp, out)
    finally:
        remove_tree(tmp)


def place_directory(tmp: Path, out: Path) -> None:
    """The finished private directory `tmp` given the umask's permissions and renamed over
    `out` (a link there is replaced, never followed; the previous export stays if the
    rename fails). `tmp` is gone afterwards either way."""
    old = tmp.with_name(tmp.name + ".old")
    try:
        os.chmod(tmp, 0o777 & ~current_umask())
        moved = out.is_symlink() or out.exists()
        if moved:
            os.replace(out, old)
        try:
            os.replace(tmp, out)
        except OSError:
            if moved:  # the previous export stays
                os.replace(old, out)
            raise
    finally:
        remove_tree(tmp)
        remove_tree(old)
