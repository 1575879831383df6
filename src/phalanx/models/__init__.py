"""Built-in models."""

from phalanx.models.minigpt import GPTConfig, MiniGPT

__all__ = ["GPTConfig", "MiniGPT"]
