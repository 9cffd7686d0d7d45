"""The watch state of runs and the reminders already sent: the scheduled jobs' queries.

The watch state (``watch``) and the reminder log (``reminders``) are what make each stall
alert, recovery and reminder go out exactly once, even across bot restarts: a job records
that it sent something in the same store it reads, and asks ``claim_reminder`` first.
"""

from __future__ import annotations

import json
from typing import Any

import sqlite_utils

from bot.store.base import StoreBase
from runner.events import utc_now


def migrate_watch(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS watch (
        run TEXT PRIMARY KEY, seen_seq INTEGER NOT NULL DEFAULT 0, seen_at TEXT NOT NULL,
        stalled INTEGER NOT NULL DEFAULT 0, alerted_at TEXT, recovered_at TEXT,
        alerts INTEGER NOT NULL DEFAULT 0)""")
    db.execute("""CREATE TABLE IF NOT EXISTS reminders (
        key TEXT PRIMARY KEY, kind TEXT NOT NULL, subject TEXT NOT NULL, sent_at TEXT NOT NULL,
        detail TEXT)""")


class WatchMixin(StoreBase):

    # -- watch --------------------------------------------------------------------
    def observe_run(self, run_id: str, seq: int, at: str, first_seen_at: str) -> dict[str, Any]:
        """Note the run's last seq as seen by the watch; ``seen_at`` moves only when it grows.

        The stall clock is the bot's own (when a new seq was first seen), never the node's,
        so a node with a skewed clock neither hides nor fakes a stall.
        """
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO watch (run, seen_seq, seen_at) VALUES (?, ?, ?)",
                       [run_id, seq, first_seen_at])
            db.execute("UPDATE watch SET seen_seq = ?, seen_at = ? WHERE run = ? AND seen_seq < ?",
                       [seq, at, run_id, seq])
            return next(db.query("SELECT * FROM watch WHERE run = ?", [run_id]))

    def watch_state(self, run_id: str) -> dict[str, Any] | None:
        rows = list(self.db.query("SELECT * FROM watch WHERE run = ?", [run_id]))
        return rows[0] if rows else None

    def mark_stalled(self, run_id: str, at: str) -> bool:
        """Flag the run as stalled; True only for the caller that flipped the flag."""
        with self.transaction() as db:
            cur = db.execute("UPDATE watch SET stalled = 1, alerted_at = ?, alerts = alerts + 1 "
                             "WHERE run = ? AND stalled = 0", [at, run_id])
            return bool(cur.rowcount == 1)

    def mark_recovered(self, run_id: str, at: str) -> bool:
        """Clear the stall flag; True only for the caller that cleared it."""
        with self.transaction() as db:
            cur = db.execute("UPDATE watch SET stalled = 0, recovered_at = ? "
                             "WHERE run = ? AND stalled = 1", [at, run_id])
            return bool(cur.rowcount == 1)

    def stalled_runs(self) -> list[dict[str, Any]]:
        return list(self.db.query("SELECT * FROM watch WHERE stalled = 1 ORDER BY run"))

    def evidence_candidates(self) -> list[dict[str, Any]]:
        """Pilots with a recorded balance and no verified evidence event yet."""
        rows = self.db.query(
            "SELECT r.id, r.status, r.run_dir, r.thread_ts, b.ts AS balance_at FROM runs r "
            "JOIN events b ON b.run = r.id AND b.type = 'balance' "
            "WHERE r.kind = 'pilot' AND NOT EXISTS (SELECT 1 FROM events e WHERE e.run = r.id "
            "AND e.type = 'evidence' AND json_extract(e.data, '$.verified') = 1) "
            "AND NOT EXISTS (SELECT 1 FROM reminders m WHERE m.key = 'evidence:' || r.id) "
            "GROUP BY r.id ORDER BY r.id")
        return list(rows)

    # -- reminders ----------------------------------------------------------------
    def claim_reminder(self, key: str, kind: str, subject: str,
                       detail: dict[str, Any] | None = None) -> bool:
        """Record that a reminder goes out; False if it already went (exactly once)."""
        with self.transaction() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO reminders (key, kind, subject, sent_at, detail) "
                "VALUES (?, ?, ?, ?, ?)",
                [key, kind, subject, utc_now(),
                 json.dumps(detail, sort_keys=True) if detail is not None else None])
            return bool(cur.rowcount == 1)

    def reminders(self, subject: str | None = None) -> list[dict[str, Any]]:
        if subject is None:
            return list(self.db.query("SELECT * FROM reminders ORDER BY sent_at, key"))
        return list(self.db.query("SELECT * FROM reminders WHERE subject = ? "
                                  "ORDER BY sent_at, key", [subject]))
