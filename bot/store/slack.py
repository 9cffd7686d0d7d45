"""Slack delivery state: event ids already handled (Slack retries), threads of runs."""

from __future__ import annotations

import sqlite_utils

from bot.store.base import StoreBase
from runner.events import utc_now


def migrate_slack(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS slack_events (
        event_id TEXT PRIMARY KEY, kind TEXT, received_at TEXT NOT NULL)""")


class SlackMixin(StoreBase):

    def claim_slack_event(self, event_id: str, kind: str = "event") -> bool:
        """True the first time an event id is seen; False for a retry or a duplicate."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO slack_events (event_id, kind, received_at) VALUES (?, ?, ?)",
            [event_id, kind, utc_now()])
        return cur.rowcount == 1

    def run_for_thread(self, channel: str, thread_ts: str) -> str | None:
        """The id of the latest pilot whose Slack thread this is (decisions typed in the thread)."""
        rows = list(self.db.query(
            "SELECT id FROM runs WHERE channel = ? AND kind = 'pilot' AND (thread_ts = ? OR id IN "
            "(SELECT run FROM message_refs WHERE transport = 'slack' AND key = 'thread' "
            "AND ref = ?)) ORDER BY id DESC LIMIT 1", [channel, thread_ts, thread_ts]))
        return str(rows[0]["id"]) if rows else None
