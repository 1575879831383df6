"""Checkpoints and exported weights."""
