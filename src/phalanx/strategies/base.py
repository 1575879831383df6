"""The strategy interface: how a model is placed, wrapped and synchronised.

A strategy is small: `wrap` a model that is already on its device, `unwrap` it back
to the user's module, and say what it can do through capability interfaces. Gradient
accumulation needs `BackwardSyncControl`; a strategy that cannot skip gradient
synchronisation simply does not implement it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch.nn as nn

if TYPE_CHECKING:
    from phalanx.runtime import Run


class Strategy(ABC):
    """Wraps a model for one kind of parallelism.

    Args:
        run: the process's `Run` (rank, world size, device, backend).
        options: strategy-specific settings (e.g. DDP's bucket size).
    """

    name: str = ""
    # every rank holds the whole model and optimizer state (DDP, single): checkpoints
    # then split the writing between ranks instead of each rank writing all of it
    replicated_state: bool = True

    def __init__(self, run: Run, **options: Any) -> None:
        self.run = run
        self.options = options

    def check(self) -> None:
        """Refuse a world this strategy cannot run in (raise `UserError`)."""

    def prepare(self, model: nn.Module) -> nn.Module:
        """Changes to the module before it is wrapped (e.g. SyncBatchNorm). Default: none."""
        return model

    @abstractmethod
    def wrap(self, model: nn.Module) -> nn.Module:
        """Wrap a module that already sits on `run.device`.

        Args:
            model: the user's module, moved and prepared.
        """

    def release(self) -> None:
        """Before the process group is destroyed: drop references to it. Default: none."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside whatever `wrap` returned."""
        return getattr(model, "module", model)


class BackwardSyncControl(ABC):
    """Capability: skip gradient synchronisation on accumulation micro-steps."""

    @abstractmethod
    def no_backward_sync(self, model: nn.Module, enabled: bool) -> AbstractContextManager:
        """Context in which backward does not synchronise gradients when `enabled`.

        Args:
            model: the wrapped module returned by `wrap`.
            enabled: True on micro-steps that must not synchronise.
        """
