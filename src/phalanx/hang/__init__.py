"""Hang diagnosis: heartbeats, stacks, one report (see watchdog.py)."""
