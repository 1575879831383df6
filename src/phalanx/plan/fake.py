"""Fake tensors for tracing a user's model (`plan.user_model.trace`): the meta module's
tensors replaced by CPU tensors of their shape under FakeTensorMode, fake inputs, and
FakeTensorMode's own error logging silenced (the plan says a failure in one line)."""

from __future__ import annotations

import contextlib


def on_fake_cpu(model, low):
    """The meta module's parameters and buffers replaced by (fake) CPU tensors of their
    shape — tied parameters stay tied; floating ones in `low` when given."""
    import torch

    made: dict[int, torch.Tensor] = {}

    def new(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            dtype = low if low is not None and t.is_floating_point() else t.dtype
            x = torch.empty(t.shape, dtype=dtype, device="cpu")
            made[id(t)] = torch.nn.Parameter(x, t.requires_grad) \
                if isinstance(t, torch.nn.Parameter) else x
        return made[id(t)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None:
                    table[name] = new(t)
    return model


@contextlib.contextmanager
def quiet(name: str):
    """FakeTensorMode logs a failing op's traceback at ERROR before raising it; the
    plan says it in one line instead."""
    import logging

    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def fake_input(x, low):
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    dtype = low if low is not None and x.is_floating_point() else x.dtype
    return torch.zeros(x.shape, dtype=dtype, device="cpu")
