"""The bot's state in SQLite: the only package that talks SQL.

One sqlite-utils Database per thread (bolt listeners, scheduler jobs and the follower run
on different threads), WAL on, a busy timeout so writers wait instead of failing. Each
concern has its own mixin module; ``Store`` composes them and runs every migration.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlite_utils

from bot.errors import StoreError
from bot.store.decisions import DecisionsMixin
from bot.store.dispatch import DispatchMixin, migrate_dispatch
from bot.store.events import EventsMixin
from bot.store.expected import ExpectedIdsMixin, migrate_expected_ids
from bot.store.leases import LeasesMixin, migrate_leases
from bot.store.progress import migrate_progress
from bot.store.record import Run, RunRecord
from bot.store.refusals import RefusalsMixin, migrate_refusals
from bot.store.retention import RetentionMixin, migrate_retention
from bot.store.runs import RunsMixin, migrate_runs
from bot.store.slack import SlackMixin, migrate_slack
from bot.store.watch import WatchMixin, migrate_watch

__all__ = ["Run", "RunRecord", "Store"]


class Store(RunsMixin, EventsMixin, DecisionsMixin, SlackMixin, LeasesMixin, RefusalsMixin,
            WatchMixin, DispatchMixin, ExpectedIdsMixin, RetentionMixin):
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the state directory {self.path.parent}: "
                             f"{exc}") from exc
        self._local = threading.local()
        self._run_keys: dict[str, int] = {}
        with self.transaction() as db:
            migrate_runs(db)
            migrate_expected_ids(db)  # after run_keys (migrate_runs)
            migrate_progress(db)
            migrate_retention(db)
            migrate_slack(db)
            migrate_leases(db)
            migrate_refusals(db)
            migrate_watch(db)
            migrate_dispatch(db)

    @property
    def db(self) -> sqlite_utils.Database:
        db: sqlite_utils.Database | None = getattr(self._local, "db", None)
        if db is None:
            try:
                conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA foreign_keys=ON")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the state database {self.path}: {exc}") from exc
            db = sqlite_utils.Database(conn)
            self._local.db = db
        return db

    @contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """One IMMEDIATE transaction: all of it is recorded, or none of it."""
        db = self.db
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"state database busy or unwritable ({self.path}): {exc}") from exc
        try:
            yield db
        except sqlite3.Error as exc:
            db.execute("ROLLBACK")
            raise StoreError(f"state database {self.path}: {exc}") from exc
        except BaseException:
            db.execute("ROLLBACK")
            raise
        else:
            try:
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StoreError(f"could not commit to {self.path}: {exc}") from exc

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.conn.close()
            self._local.db = None
