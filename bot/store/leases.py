"""Leases of rented nodes, the watch state of runs and the reminders already sent.

A lease is one rental of one node (``node`` is the node's key: ``host``, or ``host:port``
when the port is not 22, see ``bot.leases.lease_key``); its state only
moves forward and every change is kept in ``lease_changes`` with who and when. The watch
state (``watch``) and the reminder log (``reminders``) are what make each alert, recovery
and reminder go out exactly once, even across bot restarts: a job records that it sent
something in the same store it reads, and asks ``claim_reminder`` first.
"""

from __future__ import annotations

import json
from typing import Any

import sqlite_utils

from bot.pilot.leases import ENDED
from bot.store.base import StoreBase
from runner.events import utc_now


def migrate_leases(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS leases (
        id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, state TEXT NOT NULL,
        starts_at TEXT, days INTEGER, created_at TEXT NOT NULL, created_by TEXT NOT NULL,
        updated_at TEXT NOT NULL, ended_at TEXT)""")
    db.execute("CREATE INDEX IF NOT EXISTS leases_by_node ON leases(node, id)")
    db.execute("""CREATE TABLE IF NOT EXISTS lease_changes (
        id INTEGER PRIMARY KEY AUTOINCREMENT, lease INTEGER NOT NULL REFERENCES leases(id),
        from_state TEXT, to_state TEXT NOT NULL, by TEXT NOT NULL, at TEXT NOT NULL,
        note TEXT)""")
    db.execute("""CREATE TABLE IF NOT EXISTS watch (
        run TEXT PRIMARY KEY, seen_seq INTEGER NOT NULL DEFAULT 0, seen_at TEXT NOT NULL,
        stalled INTEGER NOT NULL DEFAULT 0, alerted_at TEXT, recovered_at TEXT,
        alerts INTEGER NOT NULL DEFAULT 0)""")
    db.execute("""CREATE TABLE IF NOT EXISTS reminders (
        key TEXT PRIMARY KEY, kind TEXT NOT NULL, subject TEXT NOT NULL, sent_at TEXT NOT NULL,
        detail TEXT)""")


class LeasesMixin(StoreBase):

    # -- leases -------------------------------------------------------------------
    def current_lease(self, node: str) -> dict[str, Any] | None:
        rows = list(self.db.query(
            "SELECT * FROM leases WHERE node = ? ORDER BY id DESC LIMIT 1", [node]))
        return rows[0] if rows else None

    def leases(self, *, include_ended: bool = True) -> list[dict[str, Any]]:
        """The latest lease of every node."""
        rows = self.db.query(
            "SELECT * FROM leases WHERE id IN (SELECT MAX(id) FROM leases GROUP BY node) "
            "ORDER BY node")
        return [r for r in rows if include_ended or r["state"] != ENDED]

    def open_lease(self, node: str, state: str, by: str, *, starts_at: str | None = None,
                   days: int | None = None, note: str | None = None) -> dict[str, Any]:
        """Record a new lease of ``node`` (the previous one, if any, must be ended)."""
        now = utc_now()
        with self.transaction() as db:
            table = db.table("leases")
            table.insert({"node": node, "state": state, "starts_at": starts_at, "days": days,
                          "created_at": now, "created_by": by, "updated_at": now,
                          "ended_at": now if state == ENDED else None})
            lease_id = int(table.last_pk)  # type: ignore[arg-type]  # set by the insert
            db.table("lease_changes").insert({"lease": lease_id, "from_state": None,
                                              "to_state": state, "by": by, "at": now,
                                              "note": note})
        return self.lease(lease_id)

    def lease(self, lease_id: int) -> dict[str, Any]:
        return next(self.db.query("SELECT * FROM leases WHERE id = ?", [lease_id]))

    def change_lease(self, lease_id: int, from_state: str, to_state: str, by: str, *,
                     note: str | None = None) -> bool:
        """Conditional state change with its history row; False if the state moved meanwhile."""
        now = utc_now()
        with self.transaction() as db:
            cur = db.execute(
                "UPDATE leases SET state = ?, updated_at = ?, "
                "ended_at = CASE WHEN ? = 'ended' THEN ? ELSE ended_at END "
                "WHERE id = ? AND state = ?", [to_state, now, to_state, now, lease_id, from_state])
            if cur.rowcount != 1:
                return False
            db.table("lease_changes").insert({"lease": lease_id, "from_state": from_state,
                                              "to_state": to_state, "by": by, "at": now,
                                              "note": note})
        return True

    def set_lease_terms(self, lease_id: int, *, starts_at: str | None = None,
                        days: int | None = None) -> None:
        fields = {k: v for k, v in (("starts_at", starts_at), ("days", days)) if v is not None}
        if fields:
            with self.transaction() as db:
                db.table("leases").update(lease_id, {**fields, "updated_at": utc_now()})

    def lease_changes(self, lease_id: int) -> list[dict[str, Any]]:
        return list(self.db.query(
            "SELECT * FROM lease_changes WHERE lease = ? ORDER BY id", [lease_id]))

    def runs_on_node(self, host: str, port: int = 22, *,
                     since: str | None = None) -> list[dict[str, Any]]:
        """Runs whose SSH node is ``host:port`` (oldest first), optionally created since.

        The host is compared in lower case, as lease keys are (``bot.leases.lease_key``).
        """
        rows = self.db.query(
            "SELECT id, name, kind, status, outcome, evidence, balance, created_at, thread_ts, "
            "channel FROM runs WHERE json_extract(node, '$.kind') = 'ssh' "
            "AND lower(json_extract(node, '$.host')) = ? "
            "AND COALESCE(json_extract(node, '$.port'), 22) = ? AND created_at >= ? "
            "ORDER BY id", [host.lower(), int(port), since or ""])
        return [_decode_json(r, ("evidence", "balance")) for r in rows]

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


def _decode_json(row: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: (json.loads(v) if k in keys and isinstance(v, str) else v) for k, v in row.items()}
