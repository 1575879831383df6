"""A user's language model made to answer the trainer's one call, `logits, loss = model(x, y)`.

The user's module keeps its parameters, names and class: `adapt` gives the instance a
subclass of its own class whose `forward` does the conversion (what FSDP2's
`fully_shard` does to add its hooks). So the state dict, the checkpoints and the
exported weights carry the user's own parameter names, with no wrapper prefix, and
`model.load_state_dict(load_file("model.safetensors"))` works on a fresh `factory()`.

The rule (docs/own-script.md, "Your model in `phalanx train`"):
- `forward(idx)`, idx (B, T) int64, returns the logits (B, T, vocab): a tensor, a tuple
  or list whose first item is the logits, or an object with `.logits` (Hugging Face).
  Phalanx computes the loss: cross-entropy in fp32 against the next tokens.
- If `forward` has a parameter named `targets`, Phalanx passes `targets=y` (the next
  token at each position, already shifted: nanoGPT's convention) and takes the loss back:
  a (logits, loss) pair, an object with `.loss`, or a 0-dim tensor. `labels` is never
  passed: Hugging Face models shift labels themselves; their loss comes from `.logits`.
- Any other call (keywords, more arguments: Hugging Face's `generate`) reaches the
  user's `forward` unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn as nn
from torch.nn import functional as F

from phalanx.errors import UserError


class LanguageModel(nn.Module):
    """Put before the user's class in the adapted instance's class (see `adapt`)."""

    phalanx_user_forward: ClassVar[Callable[..., Any]]  # the user's class's forward
    phalanx_takes_targets: ClassVar[bool]
    phalanx_vocab: ClassVar[int | None]  # logits' last size must be this (None: unchecked)
    phalanx_spec: ClassVar[str]  # `pkg.module:factory`, for messages
    phalanx_user_class: ClassVar[type]
    phalanx_keywords: ClassVar[dict[str, int]]  # the factory's call, e.g. {"vocab_size": 256}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        own = type(self).phalanx_user_forward
        if kwargs or not 1 <= len(args) <= 2 or \
                not all(isinstance(a, torch.Tensor) for a in args):
            return own(self, *args, **kwargs)  # not Phalanx's call: the user's module as is
        idx, targets = args[0], args[1] if len(args) == 2 else None
        if targets is not None and type(self).phalanx_takes_targets:
            logits, loss = self._own_loss(own(self, idx, targets=targets))
            return logits, loss
        logits = logits_of(own(self, idx), type(self).phalanx_spec)
        self._check_logits(idx, logits)
        if targets is None:
            return logits, None
        B, T, V = logits.shape
        return logits, F.cross_entropy(logits.float().view(B * T, V), targets.reshape(B * T))

    def _own_loss(self, out: Any) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(logits or None, loss) from what a forward given `targets=` returned."""
        spec = type(self).phalanx_spec
        if isinstance(out, torch.Tensor) and out.dim() == 0:
            return None, out
        loss = getattr(out, "loss", None)
        if loss is not None:
            return getattr(out, "logits", None), loss
        if isinstance(out, (tuple, list)) and len(out) == 2 and \
                isinstance(out[1], torch.Tensor) and out[1].dim() == 0:
            return out[0], out[1]
        raise UserError(f"`--model {spec}`: its forward(idx, targets=...) returned "
                        f"{describe(out)}; with `targets` it must return the loss: a "
                        f"(logits, loss) pair, an object with `.loss`, or a 0-dim tensor.")

    def _check_logits(self, idx: torch.Tensor, logits: torch.Tensor) -> None:
        cls = type(self)
        vocab = cls.phalanx_vocab
        if logits.dim() != 3 or logits.shape[:2] != idx.shape or \
                (vocab is not None and logits.size(-1) != vocab):
            want = f"(B, T, {vocab})" if vocab is not None else "(B, T, vocab)"
            raise UserError(
                f"`--model {cls.phalanx_spec}`: for token ids of shape {tuple(idx.shape)} its "
                f"forward returned logits of shape {tuple(logits.shape)}; expected {want}"
                + ("" if vocab is None else f": one score per token of the tokenizer's "
                   f"{vocab}-token vocabulary (the factory is given `vocab_size=` for this)")
                + ".")
        if not logits.is_floating_point():  # integer or complex: no cross-entropy, no grad
            raise UserError(
                f"`--model {cls.phalanx_spec}`: its forward returned logits of dtype "
                f"{logits.dtype}; expected floating-point scores (float32, bfloat16, …) for "
                f"the cross-entropy. Return the head's output before any cast to "
                f"{logits.dtype}.")


def logits_of(out: Any, spec: str) -> torch.Tensor:
    """The logits in a forward's output: the tensor, a tuple's first item, or `.logits`."""
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    elif not isinstance(out, torch.Tensor) and isinstance(getattr(out, "logits", None),
                                                          torch.Tensor):
        out = out.logits
    if not isinstance(out, torch.Tensor):
        raise UserError(f"`--model {spec}`: its forward(idx) returned {describe(out)}; "
                        f"expected the logits (B, T, vocab): a tensor, a tuple whose first "
                        f"item is the logits, or an object with `.logits`.")
    return out


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    return f"a {type(value).__name__}"


def takes_targets(forward: Callable[..., Any]) -> bool:
    """Whether `forward` has a parameter named `targets` (not just **kwargs)."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):  # a builtin or C forward: no signature to read
        return False
    p = params.get("targets")
    return p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)


def adapt(model: nn.Module, spec: str, vocab_size: int | None,
          keywords: dict[str, int] | None = None) -> nn.Module:
    """`model` itself, its class now a subclass of its own with the trainer's `forward`
    (`LanguageModel`); parameters, names, hooks and state untouched. Idempotent.
    `keywords`: what the factory was called with (recorded for the export)."""
    cls = type(model)
    if isinstance(model, LanguageModel):
        return model
    own = model.__dict__.get("forward")  # an instance's own forward (rare) wins, as in torch
    user_forward = (lambda self, *a, **k: own(*a, **k)) if own is not None else cls.forward
    model.__dict__.pop("forward", None)
    adapted = type(cls.__name__, (LanguageModel, cls), {
        "phalanx_user_forward": user_forward,
        "phalanx_takes_targets": takes_targets(own if own is not None else cls.forward),
        "phalanx_vocab": vocab_size, "phalanx_spec": spec, "phalanx_user_class": cls,
        "phalanx_keywords": dict(keywords or {}),
        "__module__": __name__, "__qualname__": f"LanguageModel[{cls.__qualname__}]"})
    model.__class__ = adapted
    return model


def user_class(model: nn.Module) -> type:
    """The user's own class of an adapted model (also under FSDP2's subclass of it); the
    model's class otherwise."""
    return getattr(type(model), "phalanx_user_class", type(model))


def factory_record(model: nn.Module) -> dict[str, Any] | None:
    """How to build an adapted model again: `{"factory": "pkg.module:fn", "factory_kwargs":
    {...}, "class": "pkg.module.Class"}` (config.json of an export); None for any other."""
    cls = type(model)
    if not issubclass(cls, LanguageModel):
        return None
    user = user_class(model)
    return {"factory": cls.phalanx_spec, "factory_kwargs": dict(cls.phalanx_keywords),
            "class": f"{user.__module__}.{user.__qualname__}"}


class Sampler:
    """Text from a model that has only a forward: `generate` as MiniGPT's (top-k sampling
    at a temperature), one forward of the last `block_size` tokens per new token."""

    def __init__(self, model: nn.Module, block_size: int) -> None:
        self.model, self.block_size = model, block_size

    def eval(self) -> Sampler:
        self.model.eval()
        return self

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8,
                 top_k: int | None = 40, generator: torch.Generator | None = None):
        from phalanx.models.minigpt import generate

        return generate(self.model, self.block_size, idx, max_new_tokens, temperature, top_k,
                        generator)
