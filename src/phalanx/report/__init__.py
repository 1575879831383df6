"""Rank-0 output: progress, metrics files and plots."""
