"""`preflight store` and the daily prune: what the state database holds, and the retention.

The rules of what may be pruned, and the deletes, are the store's (bot/store/retention.py);
here they are read as the terminal and the scheduler want them: per table and per run, with
each run's share of the bytes estimated from its rows (SQLite measures tables, not runs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from bot.store import Store
from bot.store.retention import PRUNED_TABLES, Pruned, RunRows, TableSize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreUsage:
    path: Path
    file_bytes: int  # the database file and its WAL on disk
    tables: list[TableSize]
    runs: list[RunRows]  # newest first
    retention_days: float  # what the prune applies (0: keeps for ever)
    prunable: list[RunRows]  # what it would prune now
    row_bytes: dict[str, float]  # per pruned table: bytes per row (0 when not measured)

    def run_bytes(self, run: RunRows) -> int:
        """The run's estimated bytes in the tables retention prunes."""
        return int(run.items * self.row_bytes.get("items", 0)
                   + run.expected_ids * self.row_bytes.get("expected_ids", 0)
                   + run.progress * self.row_bytes.get("progress", 0))

    @property
    def prunable_bytes(self) -> int:
        return sum(self.run_bytes(r) for r in self.prunable)


@dataclass(frozen=True)
class PruneResult:
    older_than_days: float
    dry_run: bool
    runs: list[RunRows]  # pruned (or, dry, that would be)
    pruned: list[Pruned]  # empty when dry
    estimated_bytes: int
    vacuumed: bool


def store_usage(store: Store, retention_days: float, now: datetime) -> StoreUsage:
    tables = store.table_sizes()
    row_bytes = {t.name: (t.bytes / t.rows if t.bytes and t.rows else 0.0)
                 for t in tables if t.name in PRUNED_TABLES}
    files = [store.path, Path(f"{store.path}-wal")]
    return StoreUsage(
        path=store.path, file_bytes=sum(f.stat().st_size for f in files if f.exists()),
        tables=tables, runs=store.run_rows(), retention_days=retention_days,
        prunable=store.prunable(retention_days, now) if retention_days > 0 else [],
        row_bytes=row_bytes)


def prune_store(store: Store, older_than_days: float, now: datetime, *,
                dry_run: bool = False, vacuum: bool = False) -> PruneResult:
    """Prune (or, ``dry_run``, only name) the runs ended for good over ``older_than_days``
    ago; 0 or less prunes nothing. A prune cut short is finished by the next one (the run
    is marked first; ``Store.prune_run``)."""
    if older_than_days <= 0:
        return PruneResult(older_than_days, dry_run, [], [], 0, False)
    usage = store_usage(store, older_than_days, now)
    runs = usage.prunable
    pruned = [] if dry_run else [store.prune_run(r.run) for r in runs]
    for done in pruned:
        log.info("pruned run %s: %d item rows, %d expected ids, %d progress rows",
                 done.run, done.items, done.expected_ids, done.progress)
    vacuumed = bool(vacuum and not dry_run)
    if vacuumed:
        store.vacuum()
    return PruneResult(older_than_days, dry_run, runs, pruned, usage.prunable_bytes, vacuumed)


class Retention:
    """What the state database holds and the prune, over the store and the settings'
    ``retention_days`` (the service holds one; `preflight store` and the scheduler use it)."""

    def __init__(self, store: Store, retention_days: float) -> None:
        self.store = store
        self.retention_days = retention_days

    def usage(self, *, older_than_days: float | None = None,
              now: datetime | None = None) -> StoreUsage:
        """What the database holds, per table and per run, and what the retention
        (``older_than_days``, else the settings') would prune now."""
        return store_usage(self.store, self._days(older_than_days),
                           now or datetime.now(timezone.utc))

    def prune(self, *, older_than_days: float | None = None, now: datetime | None = None,
              dry_run: bool = False, vacuum: bool = False) -> PruneResult:
        """Prune the runs ended for good longer than the retention ago (bot/store/
        retention.py); the settings' ``retention_days`` unless given; 0 prunes nothing."""
        return prune_store(self.store, self._days(older_than_days),
                           now or datetime.now(timezone.utc), dry_run=dry_run, vacuum=vacuum)

    def _days(self, older_than_days: float | None) -> float:
        return self.retention_days if older_than_days is None else older_than_days
