"""Phalanx's version, in one place (the package, reports and checkpoints read it)."""

__version__ = "0.1.0"
