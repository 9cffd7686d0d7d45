"""How a run's start goes: the dispatch's own events and its last sign of life.

A several-node volume's dispatch (each node's copy, card proof and Ray) can take many
minutes before its runner writes a first line. Its steps (``runner.events.DISPATCH_NODE``)
come from the bot, not the runner, so they are numbered here, apart from the runner's
events (whose ``seq`` the runner owns). ``dispatch_alive`` is the last time the bot that
dispatches gave a sign of life (a step, or its heartbeat): the watch judges a run still
``dispatching`` by it, not by when the start began.
"""

from __future__ import annotations

import json
from typing import Any

import sqlite_utils

from bot.store.base import StoreBase
from runner.events import Event, utc_now


def migrate_dispatch(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS dispatch_events (
        run TEXT NOT NULL, n INTEGER NOT NULL, type TEXT NOT NULL, ts TEXT NOT NULL,
        data TEXT NOT NULL, PRIMARY KEY (run, n))""")
    db.execute("""CREATE TABLE IF NOT EXISTS dispatch_alive (
        run TEXT PRIMARY KEY, at TEXT NOT NULL)""")


class DispatchMixin(StoreBase):

    def record_dispatch_event(self, run_id: str, etype: str, data: dict[str, Any]) -> Event:
        """Record one step of the run's dispatch (numbered per run) as a sign of life."""
        ts = utc_now()
        with self.transaction() as db:
            n = int(db.execute("SELECT COALESCE(MAX(n), 0) + 1 FROM dispatch_events "
                               "WHERE run = ?", [run_id]).fetchone()[0])
            db.execute("INSERT INTO dispatch_events (run, n, type, ts, data) "
                       "VALUES (?, ?, ?, ?, ?)",
                       [run_id, n, etype, ts, json.dumps(data, sort_keys=True, default=str)])
            db.execute("INSERT OR REPLACE INTO dispatch_alive (run, at) VALUES (?, ?)",
                       [run_id, ts])
        return Event(n, etype, run_id, ts, dict(data))

    def dispatch_events(self, run_id: str, *, since: str | None = None) -> list[Event]:
        """The dispatch's steps, in order; ``since`` (an ISO time): only those from then on
        (the current attempt's, after a resume)."""
        rows = self.db.execute(
            "SELECT n, type, ts, data FROM dispatch_events WHERE run = ? AND ts >= ? "
            "ORDER BY n", [run_id, since or ""]).fetchall()
        return [Event(n, etype, run_id, ts, json.loads(data)) for n, etype, ts, data in rows]

    def dispatch_beat(self, run_id: str, at: str | None = None) -> None:
        """The bot that dispatches the run is still at it (its heartbeat)."""
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO dispatch_alive (run, at) VALUES (?, ?)",
                       [run_id, at or utc_now()])

    def dispatch_alive_at(self, run_id: str) -> str | None:
        """The dispatch's last sign of life (a step or a heartbeat), None before any."""
        row = self.db.execute("SELECT at FROM dispatch_alive WHERE run = ?",
                              [run_id]).fetchone()
        return str(row[0]) if row else None
