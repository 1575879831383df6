"""Strategy registry: the only place that maps a strategy name to its class.

This package's top level does not import torch (config validation uses the specs);
`strategy_class` imports a strategy's module only when a worker builds it. A strategy is
built from a `StrategyChoice` (`build`), the value `choose` decided once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from phalanx.config.strategy import (
    SPECS,
    StrategyChoice,
    StrategySpec,
    choose,
    choose_for_script,
    default_name,
    spec,
)

if TYPE_CHECKING:
    from phalanx.strategies.base import Strategy
    from phalanx.strategies.topology import Topology


def strategy_class(name: str) -> type[Strategy]:
    module, _, cls = spec(name).impl.partition(":")
    return getattr(importlib.import_module(module), cls)


def build(choice: StrategyChoice, topology: Topology) -> Strategy:
    """The strategy `choice` names, with its options, for this topology (nothing decided
    again: the choice was made for this world)."""
    return strategy_class(choice.name)(topology, choice.options)


def make_strategy(name: str | None, topology: Topology, **options: Any) -> Strategy:
    """Strategy `name` (None: the default for the topology's world) for this topology,
    from keyword options (checked against its spec)."""
    return build(choose_for_script(name, topology.world_size, **options), topology)


__all__ = ["SPECS", "StrategyChoice", "StrategySpec", "build", "choose", "choose_for_script",
           "default_name", "make_strategy", "spec", "strategy_class"]
