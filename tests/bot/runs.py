"""A typed run for the tests of pure rules and views: the fields a test names, the rest a
plain pilot's (bot.pilot.record.Run, as the store would read it from such a row)."""

from __future__ import annotations

from typing import Any

from bot.pilot.record import Run

PLAN = {"gpu": "cpu", "vendor": "none", "days": 3, "lots": 1, "cards_per_lot": 1,
        "total_cards": 1, "preparation": "pytorch", "backend": "cpu",
        "lot_price_usd_per_day": "0.00", "total_usd": "0.00", "formula": "0 x 3 x 1",
        "memory_per_card_gib": None, "memory_estimate_gib": None, "notes": []}


def run_of(row: dict[str, Any] | None = None, **fields: Any) -> Run:
    """``row``/``fields``: decoded columns; a partial ``plan`` is completed from ``PLAN``."""
    given = {**(row or {}), **fields}
    if isinstance(given.get("plan"), dict):
        given["plan"] = {**PLAN, **given["plan"]}
    run = Run.from_row({"id": "r-1", "name": "demo", "attempt": 1, "kind": "pilot",
                        "status": "planned", "run_dir": "/runs/r-1",
                        "created_at": "2026-12-03T00:00:00+00:00", **given})
    if run.manifest_problem:  # a test's manifest must be one: never silently left out
        raise AssertionError(run.manifest_problem)
    return run
