"""A user's model from `--model package.module:factory` (plan, doctor): the factory called
with no arguments returns a module, or a (module, example input) pair; every failure is
one line naming the flag."""

from __future__ import annotations

import importlib

import torch

from phalanx.config.sections import build_config
from phalanx.errors import UserError
from phalanx.models import build_model


def load_factory(spec: str | None):
    if spec is None:
        return _minigpt
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UserError(f"`--model {spec}`: expected `package.module:factory`.")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except SystemExit as exc:  # a script's `exit()` at import: not a quiet rc 0 (or 5, 3)
        raise exited(spec, f"importing `{module_name}`", exc) from None
    except Exception as exc:  # ImportError, a SyntaxError, or whatever the import raised
        raise UserError(f"`--model {spec}`: cannot load it ({exc}). The module must be "
                        f"importable from the current directory or PYTHONPATH.") from None


def exited(spec: str, what: str, exc: SystemExit) -> UserError:
    """The one-line error for a user's module or factory that called `exit()` /
    `sys.exit(...)` where Phalanx expected a model."""
    code = exc.code if exc.code is None or isinstance(exc.code, int) else 1  # sys.exit("msg")
    return UserError(f"`--model {spec}`: {what} called exit (SystemExit, exit code "
                     f"{code or 0}) instead of returning. Put the module's own start-up under "
                     f"`if __name__ == \"__main__\":` and have the factory return the model.")


def _minigpt():
    cfg = build_config({"model": {"preset": "tiny"}})
    model = build_model(cfg)
    return model, torch.randint(0, model.config.vocab_size, (2, cfg.model.block_size))


def make_model(spec: str | None):
    """(module, example or None) from the factory; a UserError when it raises or returns
    something else."""
    factory = load_factory(spec)
    try:
        made = factory()
    except SystemExit as exc:
        assert spec is not None  # the built-in factory (no spec) does not exit
        raise exited(spec, f"calling `{spec.partition(':')[2]}()`", exc) from None
    except Exception as exc:  # the user's code: say what it raised, in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UserError(f"`--model {spec}`: the factory raised {type(exc).__name__}"
                        f"{': ' + first if first else ''}. Fix it so that calling it with no "
                        f"arguments returns the model.") from None
    model, example = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"`--model {spec}` returned {type(made).__name__}; expected a "
                        f"torch.nn.Module, or a (module, example input) pair.")
    return model, example
