"""``item.done`` events as rows of the ``items`` table, and back.

A volume has one item event per input: 100,000 of them for a 100k-document run. They are
recorded once, in ``items``, with their fields as columns (no JSON to write or read for
the common ones), not a second time in ``events``; ``Store.events`` gives them back as
events in seq order with the others, so a reader sees the runner's stream unchanged.
Fields the columns do not hold (a handler's ``output``, ``replayed``) go to ``extra``
as JSON; it is NULL for the usual item.

A row names its run by a small integer (``run_keys``), not by the run's 36-character id:
the row and its primary key are shorter, and inserting a 20,000-item run's rows costs
20-25% less on the state database (0.09-0.12 s against 0.125-0.146 s on the build
machine); that insert is most of what following a run costs per item. ``migrate_items``
rebuilds a table from before.
"""

from __future__ import annotations

import json
from typing import Any

from bot.pilot.forecast import ItemOutcome
from runner.events import Event, item_record
from runner.events import item_event as runner_item_event

ITEM_COLUMNS = ("seq", "item_id", "status", "category", "reason", "ts", "stage",
                "elapsed_s", "input_bytes", "extra")
# added to a database made before item events lived only here
ADDED_COLUMNS = {"ts": "TEXT", "stage": "TEXT", "elapsed_s": "REAL", "input_bytes": "INTEGER",
                 "extra": "TEXT"}
INSERT_ITEM = (f"INSERT INTO items (run_key, {', '.join(ITEM_COLUMNS)}) "
               f"VALUES ({', '.join('?' for _ in range(len(ITEM_COLUMNS) + 1))})")
SELECT_ITEMS = f"SELECT {', '.join(ITEM_COLUMNS)} FROM items WHERE run_key = ? AND seq > ?"
_ITEMS_TABLE = """CREATE TABLE IF NOT EXISTS items (
    run_key INTEGER NOT NULL REFERENCES run_keys(key), seq INTEGER NOT NULL,
    item_id TEXT NOT NULL, status TEXT, category TEXT, reason TEXT, ts TEXT, stage TEXT,
    elapsed_s REAL, input_bytes INTEGER, extra TEXT, PRIMARY KEY (run_key, seq))"""


def migrate_items(db: Any) -> None:
    """``run_keys`` and ``items``; a table from before (rows named by the run's id, maybe
    without the event's columns) is rebuilt, its rows kept."""
    db.execute("CREATE TABLE IF NOT EXISTS run_keys ("
               "key INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE REFERENCES runs(id))")
    db.execute("DROP INDEX IF EXISTS items_by_id")  # nothing looks an item up by id
    if "items" in db.table_names() and "run" in db["items"].columns_dict:
        have = db["items"].columns_dict
        for column, kind in ADDED_COLUMNS.items():
            if column not in have:
                db.execute(f"ALTER TABLE items ADD COLUMN {column} {kind}")
        db.execute("ALTER TABLE items RENAME TO items_by_run_id")
        db.execute("INSERT OR IGNORE INTO run_keys (id) SELECT DISTINCT run FROM items_by_run_id")
        db.execute(_ITEMS_TABLE)
        columns = ", ".join(ITEM_COLUMNS)
        db.execute(f"INSERT INTO items (run_key, {columns}) SELECT k.key, {columns} "
                   f"FROM items_by_run_id JOIN run_keys k ON k.id = items_by_run_id.run")
        db.execute("DROP TABLE items_by_run_id")
    db.execute(_ITEMS_TABLE)


def item_row(run_key: int, event: Event) -> tuple[Any, ...]:
    """The ``items`` row of one item.done event (a line of its own, as an older runner
    wrote it): made as the row of the batch entry the runner writes for it now."""
    return batch_rows(run_key, [item_record(event.seq, event.ts, event.data)], set())[0]


def batch_rows(run_key: int, items: list[list[Any]], known: set[int]) -> list[tuple[Any, ...]]:
    """The ``items`` rows of an ``item.batch``'s entries (checked by ``batch_items``), those
    whose seq is not in ``known`` (recorded already)."""
    rows = []
    for seq, ts, iid, status, category, reason, elapsed, size, extra in items:
        if seq in known:
            continue
        stage = None
        if extra is not None:
            extra = dict(extra)
            stage = extra.pop("stage", None)
            extra = json.dumps(extra, sort_keys=True) if extra else None
        rows.append((run_key, seq, str(iid), status, category, reason, ts, stage, elapsed,
                     size, extra))
    return rows


def item_event(run_id: str, row: tuple[Any, ...]) -> Event:
    """The item.done event an ``items`` row (``SELECT_ITEMS``'s columns) was made from."""
    seq, iid, status, category, reason, ts, stage, elapsed, size, extra = row
    more = {"stage": stage} if stage is not None else {}
    if extra:
        more.update(json.loads(extra))
    return runner_item_event(run_id, seq, ts or "", iid, status, category, reason, elapsed,
                             size, more)


# An item recorded by an older bot has its timing only in its events row's JSON.
SELECT_OUTCOMES = """
    SELECT i.item_id, i.status, COALESCE(i.ts, e.ts),
           COALESCE(i.elapsed_s, json_extract(e.data, '$.elapsed_s')),
           COALESCE(i.input_bytes, json_extract(e.data, '$.input_bytes'))
    FROM items i LEFT JOIN events e ON e.run = ? AND e.seq = i.seq AND i.ts IS NULL
    WHERE i.run_key = ? ORDER BY i.seq"""


def first_outcomes(rows: list[tuple[Any, ...]]) -> list[ItemOutcome]:
    """One outcome per id, the first recorded (a replayed or re-executed item counts once)."""
    seen: set[str] = set()
    out = []
    for row in rows:
        if row[0] not in seen:
            seen.add(row[0])
            out.append(ItemOutcome(*row))
    return out
