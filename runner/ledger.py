"""Per-item outcomes of a run, in ``ledger.sqlite`` (standard library sqlite3).

The ledger is the source of truth for the balance and for resume: an item is done when,
and only when, its row is committed here. Rows are keyed by input id (PRIMARY KEY), so an
item can never be recorded twice: a second insert is an error, not an overwrite. Batches
are written in one transaction each; the database runs in WAL mode with
``synchronous=NORMAL``, which survives a killed process at any instant (a power loss may
lose the last batches, which resume then redoes, but never corrupts the file).

Anomalies (ids a handler invented or returned twice, malformed results) are kept in their
own table, so nothing the application said is silently dropped. A row whose output was lost
with its node before it was collected is moved to ``forgotten`` (``forget_shards``): the
input is no longer done, so a resume runs it again, and the row it had is kept there.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Set

from runner.errors import RunnerError

SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL CHECK (status IN ('accepted', 'refused')),
    category TEXT,
    reason TEXT,
    output TEXT,
    attempt INTEGER NOT NULL DEFAULT 1,
    done_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS anomalies (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    id TEXT,
    detail TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS forgotten (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    category TEXT,
    output TEXT NOT NULL,
    why TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 1,
    at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
"""


# the shard an output reference (``outputs/shards/<name>.jsonl#<line>``) names, in SQL
_SHARD_OF = "substr({0}, 1, instr({0}, '#') - 1)"


class LedgerError(RunnerError, RuntimeError):
    """The ledger file cannot be opened or written (translated from sqlite3)."""


class Row(NamedTuple):
    """One item's outcome. A named tuple, not a frozen dataclass: a pilot builds one per
    item, and a frozen dataclass's __init__ costs several times a tuple's (bench/ledger.py:
    the ledger's items/s against a bare executemany)."""

    id: str
    status: str
    category: Optional[str] = None
    reason: Optional[str] = None
    output: Optional[str] = None

    def to_result(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"id": self.id, "status": self.status}
        if self.status == "accepted":
            out["category"] = self.category
        else:
            out["reason"] = self.reason
        if self.output:
            out["output"] = self.output
        return out


@dataclass(frozen=True)
class Anomaly:
    kind: str
    id: Optional[str]
    detail: str


class Ledger:
    """One run's ledger. Open with :meth:`open`; use from one thread at a time."""

    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self.path = path
        self.attempt = 1

    @classmethod
    def open(cls, path: str, *, new_attempt: bool = False) -> Ledger:
        """Open (creating) the ledger; ``new_attempt`` counts a new processing attempt."""
        try:
            # one thread at a time, not always the opener's: the volume's driver hands the
            # ledger to its recording thread for the pass (runner.recording.RecordWriter)
            conn = sqlite3.connect(path, isolation_level=None, timeout=30.0,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(SCHEMA)
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {path}: cannot open: {exc}") from exc
        ledger = cls(conn, path)
        ledger.attempt = ledger._bump_attempt() if new_attempt else ledger._read_attempt()
        return ledger

    def _read_attempt(self) -> int:
        row = self._conn.execute("SELECT value FROM meta WHERE key='attempts'").fetchone()
        return int(row[0]) if row else 0

    def _bump_attempt(self) -> int:
        with self._tx():
            n = self._read_attempt() + 1
            self._conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('attempts', ?)",
                               (str(n),))
        return n

    def _tx(self) -> _Transaction:
        return _Transaction(self._conn, self.path)

    def done_ids(self) -> Set[str]:
        """Ids already recorded (resume skips them).

        Read as one string joined by SQLite and split here: a million ids in about a third
        of the time of a row each (bench/ledger.py's resume scan). Ids with a newline in
        them (the split would not give one part per row) or a ledger too big for one string
        are read a row at a time.
        """
        try:
            try:
                joined, count = self._conn.execute(
                    "SELECT group_concat(id, char(10)), count(*) FROM items").fetchone()
            except sqlite3.DataError:  # SQLITE_TOOBIG: more than one string may hold
                joined, count = None, -1
            if joined is None and count == 0:
                return set()
            if joined is not None:
                parts = joined.split("\n")
                if len(parts) == count:
                    return set(parts)
            return {r[0] for r in self._conn.execute("SELECT id FROM items")}
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self.path}: cannot read: {exc}") from exc

    def record(self, rows: Sequence[Row], anomalies: Sequence[Anomaly] = ()) -> None:
        """Record one batch in one transaction: all of it or none of it.

        An id already in the ledger makes the whole batch fail with LedgerError naming it:
        an item marked done is never recorded (or processed) a second time.
        """
        attempt = self.attempt
        with self._tx():
            try:
                self._conn.executemany(
                    "INSERT INTO items(id, status, category, reason, output, attempt) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [(iid, status, category, reason, output, attempt)
                     for iid, status, category, reason, output in rows])
            except sqlite3.IntegrityError as exc:
                dup = self._first_existing([r.id for r in rows])
                what = f"item {dup!r} is already recorded" if dup else "batch refused"
                raise LedgerError(f"ledger {self.path}: {what}: {exc}") from exc
            if anomalies:
                self._conn.executemany(
                    "INSERT INTO anomalies(kind, id, detail, attempt) VALUES (?, ?, ?, ?)",
                    [(a.kind, a.id, a.detail, self.attempt) for a in anomalies])

    def record_first_wins(self, rows: Sequence[Row],
                          anomalies: Sequence[Anomaly] = ()) -> List[str]:
        """Record the rows whose id is not in the ledger yet, in one transaction.

        The first result of an id wins; a later one (an item executed twice, e.g. by a
        worker whose batch was re-queued) is not written and is counted in ``re_executed``.
        Returns the ids that were already recorded.
        """
        again: List[str] = []
        with self._tx():  # one look for the ids already there, one insert of the rest
            ids = [r.id for r in rows]
            known: Set[str] = set()
            for at in range(0, len(ids), 500):  # under SQLite's bound-parameter limit
                part = ids[at:at + 500]
                known.update(row[0] for row in self._conn.execute(
                    f"SELECT id FROM items WHERE id IN ({','.join('?' * len(part))})", part))
            fresh: List[Row] = []
            for r in rows:
                if r.id in known:  # committed before, or earlier in this batch
                    again.append(r.id)
                else:
                    known.add(r.id)
                    fresh.append(r)
            attempt = self.attempt
            self._conn.executemany(
                "INSERT INTO items(id, status, category, reason, output, attempt) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(r.id, r.status, r.category, r.reason, r.output, attempt) for r in fresh])
            if again:
                self._conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('re_executed', ?) ON CONFLICT(key) "
                    "DO UPDATE SET value = CAST(value AS INTEGER) + ?", (len(again), len(again)))
            if anomalies:
                self._conn.executemany(
                    "INSERT INTO anomalies(kind, id, detail, attempt) VALUES (?, ?, ?, ?)",
                    [(a.kind, a.id, a.detail, self.attempt) for a in anomalies])
        return again

    def count_re_executed(self, n: int) -> None:
        """Count ``n`` results of items already recorded (never written as rows)."""
        if n:
            with self._tx():
                self._conn.execute(
                    "INSERT INTO meta(key, value) VALUES ('re_executed', ?) ON CONFLICT(key) "
                    "DO UPDATE SET value = CAST(value AS INTEGER) + ?", (n, n))

    def re_executed(self) -> int:
        """Results that arrived for items already recorded, over every attempt."""
        row = self._conn.execute("SELECT value FROM meta WHERE key='re_executed'").fetchone()
        return int(row[0]) if row else 0

    def forget_shards(self, lost: Mapping[str, str]) -> Dict[str, int]:
        """Forget the accepted rows whose output is a line of a lost shard (``lost``: the
        shard's run-relative path -> why it is lost): each such row moves to ``forgotten``
        with its why, in one transaction, so a resume runs its input again. Matched by
        SQLite in one pass over the rows (a million rows in about a second). Returns the
        rows forgotten per shard (a shard no row names is absent)."""
        with self._tx():
            self._conn.execute("CREATE TEMP TABLE IF NOT EXISTS lost_shards "
                               "(path TEXT PRIMARY KEY, why TEXT NOT NULL)")
            self._conn.execute("DELETE FROM lost_shards")
            self._conn.executemany("INSERT OR REPLACE INTO lost_shards (path, why) "
                                   "VALUES (?, ?)", list(lost.items()))
            before = self._conn.execute("SELECT coalesce(max(n), 0) FROM forgotten").fetchone()
            self._conn.execute(
                f"INSERT INTO forgotten (id, category, output, why, attempt) "
                f"SELECT i.id, i.category, i.output, l.why, ? FROM items i "
                f"JOIN lost_shards l ON l.path = {_SHARD_OF.format('i.output')} "
                f"WHERE i.status = 'accepted' AND instr(i.output, '#') > 0", (self.attempt,))
            per_file = {str(path): int(n) for path, n in self._conn.execute(
                f"SELECT {_SHARD_OF.format('output')}, count(*) FROM forgotten "
                "WHERE n > ? GROUP BY 1", before)}
            self._conn.execute(
                "DELETE FROM items WHERE id IN (SELECT id FROM forgotten WHERE n > ?)", before)
        return per_file

    def forgotten_counts(self) -> Dict[str, int]:
        """Per id, how many times it was forgotten (each a ``rerun`` event owed)."""
        return {str(iid): int(n) for iid, n in self._conn.execute(
            "SELECT id, count(*) FROM forgotten GROUP BY id")}

    def forgotten(self) -> int:
        """Rows forgotten because their output was lost, over every attempt (an input
        forgotten twice counts twice)."""
        return int(self._conn.execute("SELECT count(*) FROM forgotten").fetchone()[0])

    def forgotten_ids(self) -> Set[str]:
        """The ids forgotten and not recorded again since (a resume has not run them yet)."""
        return {r[0] for r in self._conn.execute(
            "SELECT DISTINCT id FROM forgotten WHERE id NOT IN (SELECT id FROM items)")}

    def _first_existing(self, ids: Sequence[str]) -> Optional[str]:
        """The id that broke uniqueness: repeated in the batch or already committed."""
        seen: Set[str] = set()
        for iid in ids:
            if iid in seen:
                return iid
            seen.add(iid)
        self._conn.execute("ROLLBACK")  # drop this batch's partial inserts before looking
        self._conn.execute("BEGIN IMMEDIATE")
        for iid in ids:
            if self._conn.execute("SELECT 1 FROM items WHERE id=?", (iid,)).fetchone():
                return iid
        return None

    def rows(self) -> Iterator[Row]:
        cur = self._conn.execute(
            "SELECT id, status, category, reason, output FROM items ORDER BY id")
        for r in cur:
            yield Row._make(r)

    def anomalies(self) -> List[Anomaly]:
        cur = self._conn.execute("SELECT kind, id, detail FROM anomalies ORDER BY n")
        return [Anomaly(*r) for r in cur]

    def count(self) -> int:
        return int(self._conn.execute("SELECT count(*) FROM items").fetchone()[0])

    def close(self) -> None:
        try:
            self._conn.close()
        except sqlite3.Error:
            pass

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Transaction:
    def __init__(self, conn: sqlite3.Connection, path: str) -> None:
        self._conn = conn
        self._path = path

    def __enter__(self) -> None:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise LedgerError(f"ledger {self._path}: cannot begin a transaction: {exc}") from exc

    def __exit__(self, etype: Any, exc: Any, tb: Any) -> None:
        if etype is None:
            try:
                self._conn.execute("COMMIT")
                return
            except sqlite3.Error as err:
                self._conn.execute("ROLLBACK")
                raise LedgerError(f"ledger {self._path}: commit failed: {err}") from err
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, LedgerError):
            raise LedgerError(f"ledger {self._path}: {exc}") from exc


def ledger_path(run_dir: str) -> str:
    return os.path.join(run_dir, "ledger.sqlite")
