"""The input ids a run expects, one row each in ``expected_ids``, not a JSON cell of ``runs``.

A 1,000,000-input volume expects a million ids: as one JSON cell of its ``runs`` row they
were ~30 MB decoded by every ``SELECT *`` of the run (``preflight show --json``, the
follower's finish) and written again whole by any update of it. Here they are rows
(``run_key`` names the run by the small integer of ``run_keys``, ``pos`` keeps the listing's
order), written in batches of ``BATCH`` from any iterable and read back streamed
(``Store.iter_expected_ids``): the balance re-check walks them without the store building
the list. A run with no row expects no id list (``Store.expected_ids`` is None): a list of
none and none at all read the same.

``migrate_expected_ids`` moves the cell of a database made before into the table when the
bot opens it, then drops the column (or, on an SQLite older than 3.35, empties it): run
again, it finds nothing to move.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from bot.errors import RunNotFound
from bot.store.base import StoreBase

BATCH = 10_000  # ids per executemany (and per fetchmany when read)

_TABLE = """CREATE TABLE IF NOT EXISTS expected_ids (
    run_key INTEGER NOT NULL REFERENCES run_keys(key), pos INTEGER NOT NULL,
    id TEXT NOT NULL, PRIMARY KEY (run_key, pos)) WITHOUT ROWID"""


def migrate_expected_ids(db: Any) -> None:
    """The ``expected_ids`` table; a ``runs.expected_ids`` cell from before moved into it
    (after ``migrate_items``, which makes ``run_keys``)."""
    db.execute(_TABLE)
    if "expected_ids" not in db["runs"].columns_dict:
        return
    cells = db.execute("SELECT id, expected_ids FROM runs WHERE expected_ids IS NOT NULL")
    for run_id, cell in cells.fetchall():
        try:
            ids = json.loads(cell)
        except ValueError:
            ids = None
        if isinstance(ids, list):
            key = run_key(db, run_id)
            db.execute("DELETE FROM expected_ids WHERE run_key = ?", [key])
            write_ids(db, key, (str(i) for i in ids))
    try:
        db.execute("ALTER TABLE runs DROP COLUMN expected_ids")
    except sqlite3.OperationalError:  # SQLite < 3.35: the column stays, empty
        db.execute("UPDATE runs SET expected_ids = NULL")


def run_key(db: Any, run_id: str) -> int:
    """The run's small integer in ``run_keys``, made when missing (inside the caller's
    transaction)."""
    db.execute("INSERT OR IGNORE INTO run_keys (id) VALUES (?)", [run_id])
    return int(db.execute("SELECT key FROM run_keys WHERE id = ?", [run_id]).fetchone()[0])


def write_ids(db: Any, key: int, ids: Iterable[str]) -> int:
    """Append ``ids`` to the run's rows, ``BATCH`` at a time; how many were written."""
    it = iter(ids)
    start = db.execute("SELECT COALESCE(MAX(pos) + 1, 0) FROM expected_ids WHERE run_key = ?",
                       [key]).fetchone()[0]
    written = 0
    while chunk := list(islice(it, BATCH)):
        db.conn.executemany("INSERT INTO expected_ids (run_key, pos, id) VALUES (?, ?, ?)",
                            [(key, start + written + n, str(i)) for n, i in enumerate(chunk)])
        written += len(chunk)
    return written


class ExpectedIdsMixin(StoreBase):
    def set_expected_ids(self, run_id: str, ids: Iterable[str] | None) -> None:
        """The run's expected ids replaced by ``ids`` (None: no list), in one transaction."""
        with self.transaction() as db:
            key = run_key(db, run_id)
            db.execute("DELETE FROM expected_ids WHERE run_key = ?", [key])
            if ids is not None:
                write_ids(db, key, ids)

    def iter_expected_ids(self, run_id: str) -> Iterator[str]:
        """The run's expected ids in the listing's order, read ``BATCH`` at a time (on a
        cursor of its own: the caller may use the store meanwhile)."""
        self._known_run(run_id)
        cursor = self.db.conn.execute(
            "SELECT e.id FROM expected_ids e JOIN run_keys k ON k.key = e.run_key "
            "WHERE k.id = ? ORDER BY e.pos", [run_id])
        try:
            while rows := cursor.fetchmany(BATCH):
                yield from (str(r[0]) for r in rows)
        finally:
            cursor.close()

    def expected_ids(self, run_id: str) -> list[str] | None:
        """The input ids the run expects, as a list (None: the run has none recorded).
        A reader that can walk them takes ``iter_expected_ids``."""
        ids = list(self.iter_expected_ids(run_id))
        return ids or None

    def expected_count(self, run_id: str) -> int:
        row = self.db.execute(
            "SELECT COUNT(*) FROM expected_ids e JOIN run_keys k ON k.key = e.run_key "
            "WHERE k.id = ?", [run_id]).fetchone()
        return int(row[0])

    def _known_run(self, run_id: str) -> None:
        if self.db.execute("SELECT 1 FROM runs WHERE id = ?", [run_id]).fetchone() is None:
            raise RunNotFound(run_id)
