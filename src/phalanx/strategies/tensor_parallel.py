"""Tensor parallelism inside FSDP2 (`--tp T`): each block's matrices split over the T
consecutive ranks of a tensor-parallel group with torch's `parallelize_module`, before
`fully_shard` shards (and replicates) what every rank holds over the other mesh
dimensions — torchtitan's order, on one DeviceMesh (`Topology.tp_mesh`, `dp_mesh`).

The plan is the script's (`run.setup(model, tp_plan=)`: {module name: torch ParallelStyle,
"colwise" or "rowwise"}, or a function of the model returning one), else the model's own:
a `tp_plan()` method (MiniGPT's: `models.minigpt.MiniGPT.tp_plan`), and optionally
`tp_refusal(tp)`, a reason the model cannot be split over `tp` ranks; else the plan a
transformers model ships in its config (`base_model_tp_plan`: Llama, Mistral, Qwen …),
its "colwise"/"rowwise" entries as torch's styles, its `*` over the layer indices, under
the base model's prefix (the class's own head plan is left out: the head stays whole).
Refused in one line: a model without a plan, a plan naming a module the model does not
have, a style Phalanx does not map, a column or row split of anything but nn.Linear and
nn.Embedding (GPT-2's transposed `Conv1D` included), and a split dimension or head count
`tp` does not divide.

Gradient clipping and the non-finite checks see gradients on two meshes (the split
matrices' on (dp, tp), the rest's on dp alone), which torch's `clip_grad_norm_` refuses:
`total_norm` combines one norm per mesh.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn

from phalanx.errors import UserError
from phalanx.strategies.tensors import tie, tied_names


def split(model: nn.Module, tp_mesh: Any, given: Any = None) -> nn.Module:
    """`model` with its plan (`given`: the script's, see `checked_plan`) applied over
    `tp_mesh` (in place; the model returned)."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = checked_plan(model, tp_mesh.size(), given)
    # (DTensor warns, once per shape, that a norm over two mesh dimensions takes two
    # all-reduces: true, small, and not the user's to act on)
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    tied = tied_names(model)
    model = parallelize_module(model, tp_mesh, plan)
    _retie(model, tied, tp_mesh.size())
    return model


def _retie(model: nn.Module, tied: list[list[str]], tp: int) -> None:
    """Tie again what `parallelize_module` untied (it gives each module its own copy): one
    parameter under every name, refused when the plan split the names differently."""
    for names in tied:
        first, kept = names[0], model.get_parameter(names[0])
        for name in names[1:]:
            if _placements(model.get_parameter(name)) != _placements(kept):
                raise UserError(f"`--tp {tp}`: `{first}` and `{name}` are one tied weight, "
                                f"and the tensor-parallel plan splits them differently "
                                f"({_placements(kept) or 'whole'} and "
                                f"{_placements(model.get_parameter(name)) or 'whole'}). Split "
                                f"both the same way, or neither.")
        tie(model, names)


def _placements(t: torch.Tensor) -> tuple:
    return tuple(getattr(t, "placements", ()))


@contextmanager
def loss_context() -> Iterator[None]:
    """torch's `loss_parallel`, left however the block ends (torch's own leaves its
    handlers installed when an exception passes through it)."""
    from torch.distributed.tensor.parallel import loss_parallel

    inside = loss_parallel()
    inside.__enter__()
    try:
        yield
    finally:
        inside.__exit__(None, None, None)


def clip(params: list[torch.Tensor], max_norm: float, stages: Any = None) -> torch.Tensor:
    """torch's `clip_grad_norm_` over parameters whose gradients may live on different
    meshes: the total norm (`total_norm`; over every pipeline stage when `stages`, the
    pipeline's group, is given), then each mesh's gradients scaled by torch's
    `clip_grads_with_norm_`. Returns the norm before clipping, the same on every rank."""
    with_grad = [p for p in params if p.grad is not None]
    total = total_norm([p.grad for p in with_grad])  # type: ignore[misc]  # (not None: above)
    if stages is not None:
        from phalanx.strategies.pipeline import pipeline_norm

        total = pipeline_norm(total, stages)
    for group in _by_mesh(with_grad, lambda p: p.grad).values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def _by_mesh(items: list, tensor_of=lambda t: t) -> dict[Any, list]:
    from torch.distributed.tensor import DTensor

    groups: dict[Any, list] = {}
    for item in items:
        t = tensor_of(item)
        groups.setdefault(t.device_mesh if isinstance(t, DTensor) else None, []).append(item)
    return groups


def checked_plan(model: nn.Module, tp: int, given: Any = None) -> dict[str, Any]:
    """The plan `split` applies over `tp` ranks — `given` (a script's: {module name: style}
    or a function of the model returning one), else the model's — every module it names
    checked to exist and to split evenly."""
    plan = _plan(model, tp, given)
    modules = dict(model.named_modules())
    unknown = sorted(set(plan) - set(modules))
    if unknown:
        raise UserError(f"`--tp {tp}`: the tensor-parallel plan names `{unknown[0]}`, which "
                        f"{type(model).__name__} does not have. Name its modules as "
                        f"model.named_modules() does.")
    for name, style in plan.items():
        _check_fits(name, modules[name], style, tp)
    return plan


def _plan(model: nn.Module, tp: int, given: Any = None) -> dict[str, Any]:
    """The script's plan, else the model's own, else its transformers config's; refused
    when there is none or the model cannot be split over `tp` ranks."""
    plan_of = getattr(model, "tp_plan", None)
    shipped = getattr(getattr(model, "config", None), "base_model_tp_plan", None)
    if given is None and not callable(plan_of) and not shipped:
        raise UserError(f"`--tp {tp}`: {type(model).__name__} has no tensor-parallel plan. "
                        f"Pass one to run.setup(model, tp_plan={{module name: 'colwise' | "
                        f"'rowwise' | torch ParallelStyle}}), or give the model a `tp_plan()` "
                        f"method returning one (docs/parallelism.md); or leave --tp out.")
    refusal = getattr(model, "tp_refusal", None)
    why = refusal(tp) if callable(refusal) else _heads_refusal(getattr(model, "config", None), tp)
    if why:
        raise UserError(f"`--tp {tp}`: {why}. Choose a --tp that fits, or leave it out.")
    if given is not None:
        return _styles(model, given(model) if callable(given) else given, tp)
    if callable(plan_of):  # (MiniGPT's takes `tp`: the vocabulary is split when it divides)
        return plan_of(tp) if inspect.signature(plan_of).parameters else plan_of()
    return _transformers_plan(model, dict(shipped or {}), tp)


def _styles(model: nn.Module, plan: Any, tp: int) -> dict[str, Any]:
    """A script's plan with its "colwise"/"rowwise" entries as torch's styles."""
    from torch.distributed.tensor import parallel

    if not isinstance(plan, dict):
        raise UserError(f"`--tp {tp}`: run.setup(tp_plan=) got a {type(plan).__name__}; "
                        f"expected {{module name: 'colwise' | 'rowwise' | torch ParallelStyle}} "
                        f"or a function of the model returning one.")
    styles = {}
    for name, style in plan.items():
        if isinstance(style, str):
            style = _style(style, f"the plan splits `{name}` as `{style}`; Phalanx maps "
                                  f"{', '.join(STYLES)} (or give a torch ParallelStyle).", tp)
        if not isinstance(style, parallel.ParallelStyle):
            raise UserError(f"`--tp {tp}`: the plan's entry for `{name}` is a "
                            f"{type(style).__name__}, not a torch ParallelStyle or "
                            f"'colwise'/'rowwise'.")
        styles[name] = style
    return styles


def _check_fits(name: str, module: nn.Module, style: Any, tp: int) -> None:
    """A column or row split: of an nn.Linear or nn.Embedding, along a dimension `tp`
    divides (torch's styles take no other module; an uneven split is not Phalanx's)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if not isinstance(style, (ColwiseParallel, RowwiseParallel)):
        return
    how = "by columns" if isinstance(style, ColwiseParallel) else "by rows"
    # (weight dimension split: Linear (out, in): columns 0, rows 1; Embedding: the reverse)
    kinds = {nn.Linear: ("out_features", "in_features"),
             nn.Embedding: ("embedding_dim", "num_embeddings")}
    kind = next((k for k in kinds if isinstance(module, k)), None)
    if kind is None:
        hint = (" (transformers' Conv1D, GPT-2's, holds its weight transposed: GPT-2 cannot "
                "be split; Llama, Mistral and Qwen can)" if type(module).__name__ == "Conv1D"
                else "")
        raise UserError(f"`--tp {tp}`: the plan splits `{name}` {how}, but it is a "
                        f"{type(module).__name__}; torch's column and row styles split "
                        f"nn.Linear and nn.Embedding only{hint}. Leave `{name}` out of the "
                        f"plan, or leave --tp out.")
    field = kinds[kind][0 if isinstance(style, ColwiseParallel) else 1]
    size = getattr(module, field)
    if size % tp:
        raise UserError(f"`--tp {tp}`: the plan splits `{name}` {how}, and its {field} = "
                        f"{size} does not divide into {tp} ranks. Choose a --tp that "
                        f"divides it, or leave `{name}` out of the plan.")


def _heads_refusal(config: Any, tp: int) -> str | None:
    """A transformers config whose attention or key/value heads `tp` does not divide."""
    for field in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(config, field, None)
        if isinstance(n, int) and n % tp:
            return f"{type(config).__name__}.{field} = {n} does not divide into {tp} ranks"
    return None


STYLES = {"colwise": "ColwiseParallel", "rowwise": "RowwiseParallel"}


def _style(word: str, refusal: str, tp: int) -> Any:
    """The torch style a plan's word names (a new one each call: styles hold no state a
    module could share, but torch's plans give each module its own), or `refusal`."""
    from torch.distributed.tensor import parallel

    if word not in STYLES:
        raise UserError(f"`--tp {tp}`: {refusal}")
    return getattr(parallel, STYLES[word])()


def _transformers_plan(model: nn.Module, shipped: dict[str, str], tp: int) -> dict[str, Any]:
    """`config.base_model_tp_plan` as torch styles, by the model's own module names."""
    import re


    prefix = getattr(model, "base_model_prefix", "")
    names = [name for name, _ in model.named_modules()]
    plan: dict[str, Any] = {}
    for pattern, word in shipped.items():
        refusal = (f"{type(model).__name__}'s shipped plan splits `{pattern}` as `{word}`, "
                   f"which Phalanx does not map to a torch style (it maps "
                   f"{', '.join(STYLES)}). Give the model a `tp_plan()` method, or leave "
                   f"--tp out.")
        _style(word, refusal, tp)  # (checked before any module is matched)
        full = f"{prefix}.{pattern}" if prefix and hasattr(model, prefix) else pattern
        wanted = re.compile(re.escape(full).replace(r"\*", r"\d+") + "$")
        for name in filter(wanted.match, names):
            plan[name] = _style(word, refusal, tp)
    if not plan:
        raise UserError(f"`--tp {tp}`: {type(model).__name__}'s shipped plan names no module "
                        f"it has (e.g. `{next(iter(shipped))}`). Give it a `tp_plan()` "
                        f"method, or leave --tp out.")
    return plan


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm over every gradient, whatever mesh each lives on: one norm per mesh
    (torch's, one collective each), combined. A plain tensor, the same on every rank."""
    from torch.distributed.tensor import DTensor

    parts = []
    for group in _by_mesh(grads).values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        parts.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not parts:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack(parts)) if len(parts) > 1 else parts[0]
