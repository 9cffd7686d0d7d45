"""Slack delivery state: event ids already handled (Slack retries), threads of runs, and
each message's post intent and last send (so a restarted bot neither posts twice nor edits
faster than Slack allows)."""

from __future__ import annotations

import sqlite_utils

from bot.store.base import StoreBase
from runner.events import utc_now


def migrate_slack(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS slack_events (
        event_id TEXT PRIMARY KEY, kind TEXT, received_at TEXT NOT NULL)""")
    db.execute("""CREATE TABLE IF NOT EXISTS slack_posts (
        run TEXT NOT NULL, key TEXT NOT NULL, intent_at TEXT, sent_at REAL,
        PRIMARY KEY (run, key))""")


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

    def record_post_intent(self, run_id: str, key: str) -> bool:
        """Note that the message ``key`` of a run is about to be posted, before posting it.
        False when an earlier intent exists: a post may already be in the thread."""
        with self.transaction() as db:
            cur = db.execute("INSERT OR IGNORE INTO slack_posts (run, key, intent_at) "
                             "VALUES (?, ?, ?)", [run_id, key, utc_now()])
            if cur.rowcount == 1:
                return True
            row = db.execute("SELECT intent_at FROM slack_posts WHERE run = ? AND key = ?",
                             [run_id, key]).fetchone()
            if row[0] is None:
                db.execute("UPDATE slack_posts SET intent_at = ? WHERE run = ? AND key = ?",
                           [utc_now(), run_id, key])
                return True
            return False

    def record_sent(self, run_id: str, key: str, at: float) -> None:
        """When the message was last posted or edited (wall clock, seconds since the epoch)."""
        with self.transaction() as db:
            db.execute("INSERT INTO slack_posts (run, key, sent_at) VALUES (?, ?, ?) "
                       "ON CONFLICT (run, key) DO UPDATE SET sent_at = excluded.sent_at",
                       [run_id, key, at])

    def last_sent(self, run_id: str, key: str) -> float | None:
        row = self.db.execute("SELECT sent_at FROM slack_posts WHERE run = ? AND key = ?",
                              [run_id, key]).fetchone()
        return float(row[0]) if row and row[0] is not None else None
