"""Strategy registry: the only place that maps a strategy name to its class.

This package's top level does not import torch (config validation uses the specs);
`strategy_class` imports a strategy's module only when a worker builds it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from phalanx.config.strategy import SPECS, StrategySpec, default_name, spec

if TYPE_CHECKING:
    from phalanx.strategies.base import Strategy
    from phalanx.strategies.topology import Topology


def strategy_class(name: str) -> type[Strategy]:
    module, _, cls = spec(name).impl.partition(":")
    return getattr(importlib.import_module(module), cls)


def make_strategy(name: str, topology: Topology, **options: Any) -> Strategy:
    """Strategy `name` for this topology, from keyword options (checked against its spec)."""
    found = spec(name)
    return strategy_class(name)(topology, found.make_options(**options))


__all__ = ["SPECS", "StrategySpec", "default_name", "make_strategy", "spec", "strategy_class"]
