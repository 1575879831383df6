"""Strategy registry: the only place that maps a strategy name to its class."""

from __future__ import annotations

from phalanx.errors import UserError
from phalanx.strategies.base import BackwardSyncControl, Strategy
from phalanx.strategies.ddp import DDPStrategy
from phalanx.strategies.single import SingleStrategy

REGISTRY: dict[str, type[Strategy]] = {"single": SingleStrategy, "ddp": DDPStrategy}


def strategy_class(name: str) -> type[Strategy]:
    if name not in REGISTRY:
        raise UserError(f"unknown strategy `{name}`; available: {', '.join(REGISTRY)} "
                        f"(`--strategy`).")
    return REGISTRY[name]


__all__ = ["REGISTRY", "BackwardSyncControl", "DDPStrategy", "SingleStrategy", "Strategy",
           "strategy_class"]
