"""The store's typed run records live in ``bot.pilot.record`` (pure, so that every layer,
the transports included, can name them); the store builds them from its rows."""

from __future__ import annotations

from bot.pilot.record import COLUMNS, Run, RunRecord

__all__ = ["COLUMNS", "Run", "RunRecord"]
