"""Built-in models, building one from a Phalanx config, a user's model factory, and
MiniGPT's shapes without torch (`phalanx.models.shapes`). The package's top imports
nothing heavy: the planner's formulas use the shapes without loading torch."""

from __future__ import annotations

from typing import Any

_BUILD = {"GPTConfig": "minigpt", "MiniGPT": "minigpt", "build_model": "build",
          "gpt_config": "build", "model_name": "build"}

__all__ = ["GPTConfig", "MiniGPT", "build_model", "gpt_config", "model_name"]


def __getattr__(name: str) -> Any:
    if name in _BUILD:  # loaded on first use: importing torch is not free
        import importlib

        return getattr(importlib.import_module(f"phalanx.models.{_BUILD[name]}"), name)
    raise AttributeError(f"module 'phalanx.models' has no attribute {name!r}")
