"""A user's model from `--model package.module:factory` (train, plan, doctor).

The contract, stated once (docs/own-script.md, "Your model in `phalanx train`"):

- The factory is a function in a module importable from the current directory or
  PYTHONPATH. It is called with the keywords `vocab_size=` (the tokenizer's vocabulary)
  and `block_size=` (`--block-size`) that its signature accepts (by name, or all of them
  through `**kwargs`), and with none otherwise. It returns an `nn.Module`, or a
  (module, example input) pair (the example is what `plan`/`doctor` trace).
- For `phalanx train`, `module.forward(idx)` maps token ids (B, T) int64 to logits
  (B, T, vocab_size): a tensor, a tuple whose first item is the logits, or an object
  with `.logits`; Phalanx computes the loss. A forward with a parameter named `targets`
  is given `targets=` (the next tokens) and returns the loss itself (see
  `phalanx.models.adapter`).
- Phalanx seeds torch's RNG with `--seed` around the call (every rank builds the same
  weights), and saves and exports the module's own `state_dict()` names.

Every failure (cannot import, the factory raises or exits, returns no module, logits of
the wrong shape) is one line naming the flag.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from phalanx.errors import UserError, first_line
from phalanx.models.adapter import adapt, describe, user_class


def load_factory(spec: str | None) -> Callable[..., Any]:
    if spec is None:
        return _minigpt
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UserError(f"`--model {spec}`: expected `package.module:factory`.")
    here = os.getcwd()  # as `python -m` (the workers) puts it first: the same module here
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except SystemExit as exc:  # a script's `exit()` at import: not a quiet rc 0 (or 5, 3)
        raise exited(spec, f"importing `{module_name}`", exc) from None
    except Exception as exc:  # ImportError, a SyntaxError, or whatever the import raised
        raise UserError(f"`--model {spec}`: cannot load it ({first_line(exc)}). The module "
                        f"must be importable from the current directory or PYTHONPATH.") \
            from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        found = "nothing" if factory is None else f"a {type(factory).__name__}"
        raise UserError(f"`--model {spec}`: `{module_name}` has {found} named `{attr}`; "
                        f"expected a function that returns the model.")
    return factory


def exited(spec: str, what: str, exc: SystemExit) -> UserError:
    """The one-line error for a user's module or factory that called `exit()` /
    `sys.exit(...)` where Phalanx expected a model."""
    code = exc.code if exc.code is None or isinstance(exc.code, int) else 1  # sys.exit("msg")
    return UserError(f"`--model {spec}`: {what} called exit (SystemExit, exit code "
                     f"{code or 0}) instead of returning. Put the module's own start-up under "
                     f"`if __name__ == \"__main__\":` and have the factory return the model.")



def _minigpt(vocab_size: int = 256, block_size: int | None = None):
    """The built-in model (no `--model`): MiniGPT's tiny preset, from the default seed."""
    from phalanx.config.sections import PRESETS, TrainConfig
    from phalanx.models.minigpt import GPTConfig, MiniGPT

    shape = GPTConfig(vocab_size=vocab_size, **PRESETS["tiny"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TrainConfig().seed)
        model = MiniGPT(shape)
    return model, torch.randint(0, vocab_size, (2, shape.block_size))


def factory_keywords(factory: Callable[..., Any], **given: int | None) -> dict[str, int]:
    """The keywords of `given` (not None) that `factory`'s signature accepts."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read: called without arguments
        return {}
    anything = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return {k: v for k, v in given.items() if v is not None and (anything or (
        k in params and params[k].kind in (params[k].POSITIONAL_OR_KEYWORD,
                                           params[k].KEYWORD_ONLY)))}


def make_model(spec: str | None, vocab_size: int | None = None,
               block_size: int | None = None) -> tuple[nn.Module, Any]:
    """(module, example or None) from the factory, given the keywords it accepts; a
    UserError when it raises or returns something else."""
    model, example, _ = _make(spec, vocab_size, block_size)
    return model, example


def make_with_keywords(spec: str | None, vocab_size: int | None = None,
                       block_size: int | None = None) -> tuple[nn.Module, Any, dict[str, int]]:
    """`make_model`, and the keywords the factory accepted (and was given)."""
    return _make(spec, vocab_size, block_size)


def _make(spec: str | None, vocab_size: int | None,
          block_size: int | None) -> tuple[nn.Module, Any, dict[str, int]]:
    factory = load_factory(spec)
    keywords = factory_keywords(factory, vocab_size=vocab_size, block_size=block_size)
    call = f"{spec.partition(':')[2] if spec else 'factory'}(" \
           f"{', '.join(f'{k}={v}' for k, v in keywords.items())})"
    try:
        made = factory(**keywords)
    except SystemExit as exc:
        assert spec is not None  # the built-in factory (no spec) does not exit
        raise exited(spec, f"calling `{call}`", exc) from None
    except Exception as exc:  # the user's code: say what it raised, in one line
        text = str(exc).strip()
        raise UserError(f"`--model {spec}`: the factory raised {type(exc).__name__}"
                        f"{': ' + text.splitlines()[0] if text else ''} (called as "
                        f"`{call}`). Fix it so that this call returns the model.") from None
    model, example = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, nn.Module):
        what = describe(made) if isinstance(made, (torch.Tensor, tuple, list)) else \
            type(made).__name__
        raise UserError(f"`--model {spec}` returned {what}; expected a "
                        f"torch.nn.Module, or a (module, example input) pair.")
    return model, example, keywords


def build_user_model(spec: str, vocab_size: int, block_size: int) -> nn.Module:
    """The factory's module, adapted to `logits, loss = model(x, y)` (the caller seeds)."""
    model, _, keywords = _make(spec, vocab_size, block_size)
    return adapt(model, spec, vocab_size, keywords)


def check_user_model(spec: str, vocab_size: int, block_size: int) -> None:
    """Before launch (nothing written yet): the factory builds a module on the meta device
    whose forward maps a (1, block_size) batch of token ids to (1, block_size, vocab)
    logits. A forward that cannot run on the meta device runs once for real on the CPU.
    UserError (one line) otherwise."""
    with torch.device("meta"):
        model = build_user_model(spec, vocab_size, block_size)
    _check_trainable(model, spec)
    if _dry_forward(model, block_size, torch.device("meta")):
        return
    with torch.random.fork_rng(devices=[]):
        model = build_user_model(spec, vocab_size, block_size)
    _dry_forward(model, block_size, torch.device("cpu"), fallback=False)


def _check_trainable(model: nn.Module, spec: str) -> None:
    """At least one parameter that requires grad (the optimizer has nothing to update
    otherwise, and every rank's backward or DDP would fail)."""
    params = list(model.parameters())
    if any(p.requires_grad for p in params):
        return
    buffers = sum(1 for _ in model.buffers())
    found = (f"has {len(params)} parameters and none requires grad (all frozen)" if params
             else f"has no parameter (only {buffers} buffer{'s' * (buffers != 1)})" if buffers
             else "has no parameter")
    raise UserError(f"`--model {spec}`: its module ({user_class(model).__name__}) {found}; "
                    f"training needs at least one parameter with requires_grad=True. Return "
                    f"a module with trainable weights (nn.Parameter, not a buffer).")


def _dry_forward(model: nn.Module, block_size: int, device: torch.device,
                 fallback: bool = True) -> bool:
    """One forward without gradients; False when it failed on the meta device (to be
    tried on the CPU), a UserError when it failed otherwise."""
    idx = torch.zeros((1, block_size), dtype=torch.long, device=device)
    spec = getattr(type(model), "phalanx_spec", "?")
    try:
        with torch.no_grad():
            model(idx)
    except UserError:
        raise
    except Exception as exc:  # the user's forward: said in one line
        if fallback:
            return False
        raise UserError(f"`--model {spec}`: its forward on a (1, {block_size}) batch of token "
                        f"ids raised {first_line(exc)}. Call it in Python on "
                        f"`torch.zeros(1, {block_size}, dtype=torch.long)` to see where.") \
            from None
    return True
