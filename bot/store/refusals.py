"""What the bot's policy refused, with who, what and which rule; and the runs a lease gates."""

from __future__ import annotations

import json
from typing import Any

import sqlite_utils

from bot.store.base import StoreBase
from runner.events import utc_now


def migrate_refusals(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS refusals (
        id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, who TEXT NOT NULL,
        origin TEXT NOT NULL, action TEXT NOT NULL, subject TEXT, rule TEXT NOT NULL,
        message TEXT NOT NULL, "where" TEXT NOT NULL, detail TEXT)""")


class RefusalsMixin(StoreBase):

    def record_refusal(self, record: dict[str, Any]) -> None:
        """One row per refused rule: ``who``, ``origin``, ``action``, ``subject``, ``rule``,
        ``message``, ``where`` and an optional JSON ``detail``."""
        row = {**record, "at": utc_now(), "detail": json.dumps(record.get("detail"))}
        with self.transaction() as db:
            db.table("refusals").insert(row)

    def refusals(self, *, limit: int = 100) -> list[dict[str, Any]]:
        rows = self.db.query("SELECT * FROM refusals ORDER BY id DESC LIMIT ?", [limit])
        return [{**r, "detail": json.loads(r["detail"] or "null")} for r in rows]

