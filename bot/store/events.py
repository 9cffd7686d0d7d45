"""A run's events, stages and items.

Events are recorded before anything is shown: ``record_events`` stores a batch of events,
the stage and item rows they imply and the follower's position (last seq, byte offset) in
one transaction, and returns only the events that were new, so a restarted follower that
reads the same lines again neither loses nor repeats anything.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import sqlite_utils

from bot.pilot.forecast import ItemOutcome
from bot.store.base import StoreBase
from bot.store.items import (
    INSERT_ITEM,
    SELECT_ITEMS,
    SELECT_OUTCOMES,
    batch_rows,
    first_outcomes,
    item_event,
    item_row,
)
from bot.store.progress import (
    UPSERT,
    current_attempt,
    latest_progress_seq,
    progress_events,
    progress_rows,
)
from bot.store.runs import decode_row
from runner.events import (
    AFTER_FAILURE_STAGES,
    ITEM_BATCH,
    ITEM_DONE,
    PROGRESS,
    STAGE_EVENT_TYPES,
    Event,
    batch_items,
    utc_now,
)

# an item event of an input run again after its output was lost (runner/volume_lost.py):
# its ``extra`` holds a JSON true under ``rerun``
RERUN = "(extra IS NOT NULL AND json_type(extra, '$.rerun') = 'true')"
STAGE_STATE = {"stage.started": "running", "stage.passed": "passed",
               "stage.failed": "failed", "stage.skipped": "skipped"}


class EventsMixin(StoreBase):
    """The events, stages and items tables of the runs."""

    _run_keys: dict[str, int]  # run id -> its key in items, once known (set by Store)

    def record_events(self, run_id: str, events: list[Event], offset: int) -> list[Event]:
        """Record events and the follower position atomically; return the new ones.

        One transaction and a few statements per chunk, whatever its size: the seqs already
        recorded are looked up at once and the rest inserted with ``executemany``. An
        ``item.batch`` goes to ``items`` row by row, without an event object per item; it
        is returned (once) when any of its items is new.
        """
        fresh: list[Event] = []
        key = self._run_key(run_id, create=True) if events else 0
        with self.transaction() as db:
            if events:
                batches = {id(e): batch_items(e) for e in events if e.type == ITEM_BATCH}
                span = [min(batches[id(e)][0][0] if id(e) in batches else e.seq
                            for e in events), max(e.seq for e in events)]
                known = {row[0] for row in db.execute(
                    "SELECT seq FROM events WHERE run = ? AND seq BETWEEN ? AND ? UNION "
                    "SELECT seq FROM items WHERE run_key = ? AND seq BETWEEN ? AND ?",
                    [run_id, *span, key, *span])}
                seen_progress = latest_progress_seq(db, run_id)
                rows: list[tuple[Any, ...]] = []
                for event in events:
                    if id(event) in batches:
                        new = batch_rows(key, batches[id(event)], known)
                        if new:
                            known.update(row[1] for row in new)
                            rows.extend(new)
                            fresh.append(event)
                    elif event.seq not in known and not (
                            event.type == PROGRESS and event.seq <= seen_progress):
                        known.add(event.seq)
                        fresh.append(event)
                        if event.type == ITEM_DONE:
                            rows.append(item_row(key, event))
                attempt = current_attempt(db, run_id)  # before this chunk's run.started
                db.conn.executemany(
                    "INSERT INTO events (run, seq, type, ts, stage, data) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [(run_id, e.seq, e.type, e.ts, e.stage, json.dumps(e.data, sort_keys=True))
                     for e in fresh if e.type not in (ITEM_DONE, ITEM_BATCH, PROGRESS)])
                if any(e.type == PROGRESS for e in fresh):  # the latest kept (progress.py)
                    db.conn.executemany(UPSERT, progress_rows(run_id, attempt, fresh))
                for event in fresh:
                    if event.type in STAGE_EVENT_TYPES and event.stage:
                        _apply_stage(db, run_id, event)
                db.conn.executemany(INSERT_ITEM, rows)
            last = max([e.seq for e in events], default=0)
            db.execute(
                "UPDATE runs SET last_seq = MAX(last_seq, ?),"
                " events_offset = MAX(events_offset, ?),"
                " last_event_at = COALESCE(?, last_event_at) WHERE id = ?",
                [last, offset, fresh[-1].ts if fresh else None, run_id])
        return fresh

    def events(self, run_id: str, *, after_seq: int = 0) -> list[Event]:
        """Every event recorded after ``after_seq``, item events included, in seq order; of
        the progress events, each attempt's latest (bot/store/progress.py)."""
        return self._with_items(run_id, after_seq, self._events(
            "SELECT * FROM events WHERE run = ? AND seq > ?", [run_id, after_seq])
            + progress_events(self.db, run_id, after_seq))

    def events_of_type(self, run_id: str, etype: str, *, after_seq: int = 0) -> list[Event]:
        if etype == PROGRESS:
            return progress_events(self.db, run_id, after_seq)
        found = self._events("SELECT * FROM events WHERE run = ? AND type = ? AND seq > ? "
                             "ORDER BY seq", [run_id, etype, after_seq])
        return self._with_items(run_id, after_seq, found) if etype == ITEM_DONE else found

    def event_count(self, run_id: str) -> int:
        """How many of the run's events were recorded, each progress event folded into its
        attempt's latest counted too: the run's ``last_seq`` when none was lost."""
        key = self._run_key(run_id)
        row = self.db.execute(
            "SELECT (SELECT COUNT(*) FROM (SELECT seq FROM events WHERE run = ? UNION "
            "SELECT seq FROM items WHERE run_key = ?)) + "
            "(SELECT COALESCE(SUM(folded), 0) FROM progress WHERE run = ?)",
            [run_id, key, run_id]).fetchone()
        return int(row[0])

    def _with_items(self, run_id: str, after_seq: int, found: list[Event]) -> list[Event]:
        """``found`` (rows of ``events``) with the item events of ``items``, in seq order; an
        item event an older bot also kept in ``events`` is there once."""
        by_seq = {e.seq: e for e in self._item_events(run_id, after_seq)}
        by_seq.update((e.seq, e) for e in found)
        return [by_seq[seq] for seq in sorted(by_seq)]

    def _events(self, sql: str, params: list[Any]) -> list[Event]:
        return [Event(seq=seq, type=etype, run=run, ts=ts, data=json.loads(data))
                for run, seq, etype, ts, _, data in self.db.execute(sql, params).fetchall()]

    def _item_events(self, run_id: str, after_seq: int) -> list[Event]:
        rows = self.db.execute(SELECT_ITEMS + " ORDER BY seq",
                               [self._run_key(run_id), after_seq]).fetchall()
        return [item_event(run_id, row) for row in rows]

    def _run_key(self, run_id: str, *, create: bool = False) -> int:
        """The small integer that names ``run_id`` in ``items`` (``run_keys``); created,
        in a transaction of its own, when the run's first events are recorded. 0 (which
        names no rows) before that."""
        keys = self._run_keys
        if run_id in keys:
            return keys[run_id]
        if create:
            with self.transaction() as db:
                db.execute("INSERT OR IGNORE INTO run_keys (id) VALUES (?)", [run_id])
        row = self.db.execute("SELECT key FROM run_keys WHERE id = ?", [run_id]).fetchone()
        if row is None:
            return 0
        keys[run_id] = int(row[0])  # a key never changes once committed
        return keys[run_id]

    def interrupt_stages(self, run_id: str) -> None:
        """A runner that died: its stage still ``running`` is ``interrupted``."""
        with self.transaction() as db:
            db.execute("UPDATE stages SET state = 'interrupted', ended_at = ? "
                       "WHERE run = ? AND state = 'running'", [utc_now(), run_id])

    def stages(self, run_id: str) -> list[dict[str, Any]]:
        return [decode_row(r) for r in self.db.query(
            "SELECT * FROM stages WHERE run = ? ORDER BY rowid", [run_id])]

    def item_outcomes(self, run_id: str) -> list[ItemOutcome]:
        """The first recorded outcome of each item id, in seq order (forecast, report)."""
        return first_outcomes(self.db.execute(SELECT_OUTCOMES,
                                              [run_id, self._run_key(run_id)]).fetchall())

    def items(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT item_id, status, category, reason, seq FROM items "
                               "WHERE run_key = ? ORDER BY seq", [self._run_key(run_id)]).fetchall()
        return [{"id": iid, "status": status, "category": category, "reason": reason,
                 "seq": seq} for iid, status, category, reason, seq in rows]

    def iter_items(self, run_id: str, page: int = 20_000) -> Iterator[dict[str, Any]]:
        """``items`` a page at a time (by seq): a million-item run is never held whole."""
        key, after = self._run_key(run_id), -1
        while True:
            rows = self.db.execute(
                f"SELECT item_id, status, category, reason, seq, {RERUN} FROM items "
                "WHERE run_key = ? AND seq > ? ORDER BY seq LIMIT ?",
                [key, after, page]).fetchall()
            for iid, status, category, reason, seq, rerun in rows:
                item = {"id": iid, "status": status, "category": category, "reason": reason,
                        "seq": seq}
                if rerun:  # run again after its output was lost (runner/volume_lost.py)
                    item["rerun"] = True
                yield item
            if len(rows) < page:
                return
            after = rows[-1][4]

    def item_output(self, run_id: str, item_id: str) -> tuple[str, str | None] | None:
        """(status, output reference) of the outcome of input ``item_id`` the balance
        counts: its latest ``rerun`` (run again after its output was lost), else its first
        recorded (a replay repeats it), or None when none is recorded (``preflight outputs
        RUN ID``)."""
        row = self.db.execute("SELECT status, extra FROM items WHERE run_key = ? AND "
                              f"item_id = ? ORDER BY {RERUN} DESC, "
                              f"CASE WHEN {RERUN} THEN -seq ELSE seq END LIMIT 1",
                              [self._run_key(run_id), item_id]).fetchone()
        if row is None:
            return None
        try:
            extra = json.loads(row[1]) if row[1] else {}
        except ValueError:
            extra = {}
        output = extra.get("output") if isinstance(extra, dict) else None
        return str(row[0]), output if isinstance(output, str) else None


def _apply_stage(db: sqlite_utils.Database, run_id: str, event: Event) -> None:
    state = STAGE_STATE[event.type]
    data = event.data
    started = event.ts if event.type == "stage.started" else None
    ended = None if event.type == "stage.started" else event.ts
    db.execute(
        "INSERT INTO stages (run, stage, state, facts, error, reason, started_at, ended_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run, stage) DO UPDATE SET "
        "state = excluded.state, facts = COALESCE(excluded.facts, facts), "
        "error = COALESCE(excluded.error, error), reason = COALESCE(excluded.reason, reason), "
        "started_at = COALESCE(excluded.started_at, started_at), ended_at = excluded.ended_at",
        [run_id, event.stage, state,
         json.dumps(data["facts"], sort_keys=True) if data.get("facts") is not None else None,
         json.dumps(data["error"], sort_keys=True) if data.get("error") is not None else None,
         data.get("reason"), started, ended])
    if event.type == "stage.started":
        db.execute("UPDATE runs SET stage_reached = ? WHERE id = ? AND NOT "
                   "(? AND first_error IS NOT NULL)",
                   [event.stage, run_id, event.stage in AFTER_FAILURE_STAGES])
    if event.type == "stage.failed":
        error = {"stage": event.stage, **(data.get("error") or {})}
        db.execute("UPDATE runs SET first_error = COALESCE(first_error, ?) WHERE id = ?",
                   [json.dumps(error, sort_keys=True), run_id])
