"""Decisions on runs: every one recorded (accepted or refused, with why), an accepted one
and the run's move to ``decided`` in one transaction, and an approval undone (kept as
refused) when its volume could not be created."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlite_utils

from bot.pilot.states import RunStatus
from bot.store.base import StoreBase
from runner.events import utc_now


class DecisionsMixin(StoreBase):
    """The decisions table, and the moves of a run's status a decision makes."""

    def record_decision(self, record: dict[str, Any]) -> dict[str, Any]:
        record = {"at": utc_now(), **record}
        with self.transaction() as db:
            _insert_decision(db, record)
        return record

    def decide_run(self, run_id: str, record: dict[str, Any]) -> dict[str, Any] | None:
        """Record an accepted decision and move the run to ``decided``, atomically.

        Returns None (and records nothing) when the run is no longer awaiting a decision.
        """
        record = {"at": utc_now(), **record, "run": run_id, "accepted": 1}
        moved = self._move_status_then(run_id, RunStatus.AWAITING_DECISION, RunStatus.DECIDED,
                                       lambda db: _insert_decision(db, record))
        return record if moved else None

    def reopen_decision(self, run_id: str, decision_id: int, refusal: str) -> bool:
        """Undo an accepted decision whose consequence could not be created (the volume of
        an approval): the decision is kept as refused, with why, and the run awaits its
        decision again, atomically. False when the run is no longer ``decided``."""
        return self._move_status_then(
            run_id, RunStatus.DECIDED, RunStatus.AWAITING_DECISION,
            lambda db: db.execute(
                "UPDATE decisions SET accepted = 0, refusal = ? WHERE id = ? AND run = ?",
                [refusal, decision_id, run_id]))

    def _move_status_then(self, run_id: str, from_status: RunStatus, to_status: RunStatus,
                          then: Callable[[sqlite_utils.Database], object]) -> bool:
        """In one transaction: move the run from ``from_status`` to ``to_status`` and, only
        when it moved, do ``then`` in the same transaction. False (and nothing done) when
        the run was not in ``from_status``."""
        with self.transaction() as db:
            cur = db.execute("UPDATE runs SET status = ? WHERE id = ? AND status = ?",
                             [str(to_status), run_id, str(from_status)])
            if cur.rowcount != 1:
                return False
            then(db)
        return True

    def decisions(self, run_id: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        if run_id is None:
            return list(self.db.query("SELECT * FROM decisions ORDER BY id DESC LIMIT ?", [limit]))
        return list(self.db.query("SELECT * FROM decisions WHERE run = ? ORDER BY id", [run_id]))


def _insert_decision(db: sqlite_utils.Database, record: dict[str, Any]) -> None:
    """Insert a decision and set its new ``id`` on ``record``."""
    table = db.table("decisions")
    table.insert(record)
    record["id"] = table.last_pk
