"""Slack delivery state: event ids already handled (Slack retries), per-message edits."""

from __future__ import annotations

import sqlite_utils

from runner.events import utc_now


def migrate_slack(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS slack_events (
        event_id TEXT PRIMARY KEY, kind TEXT, received_at TEXT NOT NULL)""")


class SlackMixin:
    db: sqlite_utils.Database

    def claim_slack_event(self, event_id: str, kind: str = "event") -> bool:
        """True the first time an event id is seen; False for a retry or a duplicate."""
        cur = self.db.execute(
            "INSERT OR IGNORE INTO slack_events (event_id, kind, received_at) VALUES (?, ?, ?)",
            [event_id, kind, utc_now()])
        return cur.rowcount == 1
