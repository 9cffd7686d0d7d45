"""Preflight bot: plans, dispatches and follows pilots; records everything in SQLite."""

__version__ = "0.1.0"
