"""What the state database holds, and the retention that keeps it from growing for ever.

A 1,000,000-input volume leaves ~10^6 ``items`` rows, its expected ids and its progress in
the database: ~220 MB a run, none of it read once the run is over and judged. Its run
directory holds the same facts in full (``balance.csv`` one row per input, ``events.jsonl``
every event, the listing of the inputs), and the run's row keeps what is shown: verdict,
balance counts and problems, its first rows, forecast, evidence. So a run *ended for good*
longer than the retention ago has its ``items`` rows, its expected ids and its ``progress``
rows deleted, and ``runs.items_pruned_at`` says when (recorded first; the rows then go
``PRUNE_CHUNK`` at a time, so that the follower's writes never wait long). Nothing else
is touched: the run row, stages, decisions, the other events, the files on disk.

Ended for good: ``decided``, ``finished``, ``stopped`` or ``dispatch_failed`` (not a pilot
``awaiting_decision``: its approval forecasts from its items). A resume of a pruned run is
refused (``bot.pilot.states.resume_refusal``: its balance re-check would lack the rows). A
pilot is pruned only with its volume run (a volume's forecast on its proven nodes reads the
pilot's items at each start). When it ended: ``finished_at``, else its last event, start or
creation (a start that failed has no ``finished_at``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bot.pilot.clock import now_utc, read_time
from bot.pilot.states import S
from bot.store.base import StoreBase

# The states after which nothing reads a run's items again (unless resumed; see above).
PRUNABLE = (S.DECIDED, S.FINISHED, S.STOPPED, S.DISPATCH_FAILED)
# The tables a run's rows are pruned from, and how each names its run.
PRUNED_TABLES = ("items", "expected_ids", "progress")


def migrate_retention(db: Any) -> None:
    """``runs.items_pruned_at``: when the run's item rows were pruned (NULL: kept)."""
    if "items_pruned_at" not in db["runs"].columns_dict:
        db.execute("ALTER TABLE runs ADD COLUMN items_pruned_at TEXT")


@dataclass(frozen=True)
class RunRows:
    """A run's rows in the tables retention prunes (``progress``: its rows, one per attempt),
    its rows in ``events``, and when it ended."""

    run: str
    status: str
    kind: str
    ended_at: str | None
    pruned_at: str | None
    items: int
    expected_ids: int
    progress: int
    events: int

    @property
    def prunable_rows(self) -> int:
        return self.items + self.expected_ids + self.progress


@dataclass(frozen=True)
class TableSize:
    name: str
    rows: int
    bytes: int | None  # None: this SQLite has no dbstat table to measure with


@dataclass(frozen=True)
class Pruned:
    run: str
    items: int
    expected_ids: int
    progress: int
    at: str


PRUNE_CHUNK = 50_000  # rows deleted per transaction
# the next ``chunk`` seqs (positions) of the run's rows: a range of the primary key
_ITEMS_CHUNK = ("DELETE FROM items WHERE run_key = ? AND seq < "
                "(SELECT MIN(seq) FROM items WHERE run_key = ?) + ?")
_IDS_CHUNK = ("DELETE FROM expected_ids WHERE run_key = ? AND pos < "
              "(SELECT MIN(pos) FROM expected_ids WHERE run_key = ?) + ?")

_RUN_ROWS = """
    SELECT r.id, r.status, r.kind,
           COALESCE(r.finished_at, r.last_event_at, r.started_at, r.created_at),
           r.items_pruned_at,
           (SELECT COUNT(*) FROM items i WHERE i.run_key = k.key),
           (SELECT COUNT(*) FROM expected_ids x WHERE x.run_key = k.key),
           (SELECT COUNT(*) FROM progress p WHERE p.run = r.id),
           (SELECT COUNT(*) FROM events e WHERE e.run = r.id)
    FROM runs r LEFT JOIN run_keys k ON k.id = r.id"""


class RetentionMixin(StoreBase):
    def table_sizes(self) -> list[TableSize]:
        """Every table of the database with its rows and bytes (its indexes included),
        largest first."""
        tables = [r[0] for r in self.db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        owner = {r[0]: r[1] for r in self.db.execute(
            "SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')")}
        sizes: dict[str, int] = {}
        try:
            for name, size in self.db.execute("SELECT name, SUM(pgsize) FROM dbstat "
                                              "GROUP BY name"):
                table = owner.get(name, name)
                sizes[table] = sizes.get(table, 0) + int(size)
            measured = True
        except sqlite3.Error:  # built without SQLITE_ENABLE_DBSTAT_VTAB
            measured = False
        out = [TableSize(t, int(self.db.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0]),
                         sizes.get(t, 0) if measured else None) for t in tables]
        return sorted(out, key=lambda t: (-(t.bytes or 0), -t.rows, t.name))

    def database_bytes(self) -> int:
        """The database's size as SQLite counts it (pages in use and free)."""
        pages = self.db.execute("PRAGMA page_count").fetchone()[0]
        return int(pages) * int(self.db.execute("PRAGMA page_size").fetchone()[0])

    def run_rows(self, run_id: str | None = None) -> list[RunRows]:
        """Per run (or the one run), its rows in the tables retention prunes, newest first."""
        where, params = (" WHERE r.id = ?", [run_id]) if run_id else ("", [])
        rows = self.db.execute(_RUN_ROWS + where + " ORDER BY r.id DESC", params).fetchall()
        return [RunRows(*row) for row in rows]

    def prunable(self, older_than_days: float, now: datetime) -> list[RunRows]:
        """The runs retention would prune now: ended for good more than ``older_than_days``
        ago, not pruned yet (or left with rows), a pilot only with its volume run."""
        cutoff = now - timedelta(days=older_than_days)
        runs = self.run_rows()
        picked = {r.run: r for r in runs if r.status in PRUNABLE and _ended_before(r, cutoff)
                  and (r.pruned_at is None or r.prunable_rows)}
        done = {r.run for r in runs if r.pruned_at is not None}
        volumes = dict(self.db.execute(
            "SELECT parent_run, id FROM runs WHERE kind = 'volume' AND parent_run IS NOT NULL"
        ).fetchall())
        return [r for r in picked.values()
                if r.run not in volumes or volumes[r.run] in picked or volumes[r.run] in done]

    def prune_run(self, run_id: str, *, chunk: int = PRUNE_CHUNK) -> Pruned:
        """Record that the run is pruned, then delete its item rows and expected ids
        ``chunk`` at a time, each chunk a transaction of its own (a million rows in one
        would hold the follower's writes back for seconds), and its progress rows. A prune
        cut short leaves the run marked with rows left: the next one finishes it."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET items_pruned_at = COALESCE(items_pruned_at, ?) "
                       "WHERE id = ?", [now_utc(), run_id])
            at = str(db.execute("SELECT items_pruned_at FROM runs WHERE id = ?",
                                [run_id]).fetchone()[0])
            row = db.execute("SELECT key FROM run_keys WHERE id = ?", [run_id]).fetchone()
            key = row[0] if row else -1
            progress = db.execute("DELETE FROM progress WHERE run = ?", [run_id]).rowcount
            # an item event an older bot also kept in events: the same fact as its row
            old = db.execute("DELETE FROM events WHERE run = ? AND type = 'item.done'",
                             [run_id]).rowcount
        items = self._delete_chunks(_ITEMS_CHUNK, key, chunk)
        ids = self._delete_chunks(_IDS_CHUNK, key, chunk)
        return Pruned(run_id, items + int(old), ids, int(progress), at)

    def _delete_chunks(self, sql: str, key: int, chunk: int) -> int:
        deleted = 0
        while True:
            with self.transaction() as db:
                n = int(db.execute(sql, [key, key, chunk]).rowcount)
            deleted += n
            if n == 0:
                return deleted

    def vacuum(self) -> None:
        """Give the pages pruning freed back to the file system (SQLite reuses them anyway;
        VACUUM rewrites the whole database, so it waits for a quiet moment)."""
        self.db.execute("VACUUM")


def _ended_before(rows: RunRows, cutoff: datetime) -> bool:
    ended = read_time(rows.ended_at)
    if ended is None:
        return False
    if ended.tzinfo is None:
        ended = ended.replace(tzinfo=cutoff.tzinfo)
    return ended < cutoff
