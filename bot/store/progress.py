"""A run's ``progress`` events as the latest one per attempt (a row replaced), not a row each.

The runner reports its progress every few seconds for the whole run: a 3-day volume wrote
~10^5 of those lines, each naming every worker, and the bot kept every one in ``events``
(the largest part of its database after the items). What reads them wants the latest:
the status message's count (from the events just read, never the store), the last event of
a runner that died, a volume's items done at its end, and the time an attempt's work stage
last showed life when its runner was killed mid-stage (``attempt_seconds``). So one row per
(run, attempt) holds the latest, and ``folded`` counts the progress events it stands for;
an attempt is named by the ``seq`` of the ``run.started`` that opened it (0 before any).

The numbering stays whole: ``Store.events`` gives the other events and each attempt's latest
progress in seq order, and ``Store.event_count`` counts every event recorded, the folded
progress ones included, which equals the run's ``last_seq`` when none was lost (what the
volume tests check). The runner's ``events.jsonl`` keeps every line.

``migrate_progress`` folds the progress rows of a database made before (``events``) when the
bot opens it; run again it finds none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from runner.events import PROGRESS, RUN_STARTED, Event

_TABLE = """CREATE TABLE IF NOT EXISTS progress (
    run TEXT NOT NULL REFERENCES runs(id), attempt INTEGER NOT NULL, seq INTEGER NOT NULL,
    ts TEXT NOT NULL, data TEXT NOT NULL, folded INTEGER NOT NULL,
    PRIMARY KEY (run, attempt))"""

# a row is replaced only by a later event; ``folded`` adds up the events it stands for
UPSERT = """INSERT INTO progress (run, attempt, seq, ts, data, folded) VALUES (?, ?, ?, ?, ?, ?)
    ON CONFLICT (run, attempt) DO UPDATE SET seq = excluded.seq, ts = excluded.ts,
    data = excluded.data, folded = progress.folded + excluded.folded
    WHERE excluded.seq > progress.seq"""

_FOLD_OLD = """INSERT INTO progress (run, attempt, seq, ts, data, folded)
    SELECT run, attempt, seq, ts, data, n FROM (
        SELECT run, attempt, seq, ts, data,
               ROW_NUMBER() OVER (PARTITION BY run, attempt ORDER BY seq DESC) AS nth,
               COUNT(*) OVER (PARTITION BY run, attempt) AS n
        FROM (SELECT e.run, e.seq, e.ts, e.data,
                     (SELECT COALESCE(MAX(r.seq), 0) FROM events r WHERE r.run = e.run
                      AND r.type = 'run.started' AND r.seq < e.seq) AS attempt
              FROM events e WHERE e.type = 'progress'))
    WHERE nth = 1
    ON CONFLICT (run, attempt) DO UPDATE SET seq = excluded.seq, ts = excluded.ts,
    data = excluded.data, folded = progress.folded + excluded.folded
    WHERE excluded.seq > progress.seq"""


def migrate_progress(db: Any) -> None:
    """The ``progress`` table; progress rows of ``events`` (a database from before) folded
    into it, then deleted."""
    db.execute(_TABLE)
    if db.execute("SELECT 1 FROM events WHERE type = 'progress' LIMIT 1").fetchone():
        db.execute(_FOLD_OLD)
        db.execute("DELETE FROM events WHERE type = 'progress'")


def latest_progress_seq(db: Any, run_id: str) -> int:
    """The seq of the run's latest recorded progress (0: none): one at or below it was seen
    (the runner numbers its events in order, so an older one is a line read again)."""
    row = db.execute("SELECT COALESCE(MAX(seq), 0) FROM progress WHERE run = ?",
                     [run_id]).fetchone()
    return int(row[0])


def current_attempt(db: Any, run_id: str) -> int:
    """The seq of the run's latest recorded ``run.started`` (0: none)."""
    row = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE run = ? AND type = ?",
                     [run_id, RUN_STARTED]).fetchone()
    return int(row[0])


def progress_rows(run_id: str, attempt: int, fresh: Iterable[Event]) -> list[tuple[Any, ...]]:
    """The ``progress`` rows of the new events ``fresh`` (in seq order, the run's latest
    attempt opened at ``attempt``): per attempt, its latest progress and how many there
    were. A ``run.started`` among them opens the attempt the progress after it belongs to."""
    latest: dict[int, tuple[Event, int]] = {}
    for event in fresh:
        if event.type == RUN_STARTED:
            attempt = max(attempt, event.seq)
        elif event.type == PROGRESS:
            count = latest[attempt][1] if attempt in latest else 0
            latest[attempt] = (event, count + 1)
    return [(run_id, key, e.seq, e.ts, json.dumps(e.data, sort_keys=True), n)
            for key, (e, n) in latest.items()]


def progress_events(db: Any, run_id: str, after_seq: int) -> list[Event]:
    """Each attempt's latest progress after ``after_seq``, as events, in seq order."""
    rows = db.execute("SELECT seq, ts, data FROM progress WHERE run = ? AND seq > ? "
                      "ORDER BY seq", [run_id, after_seq]).fetchall()
    return [Event(seq=seq, type=PROGRESS, run=run_id, ts=ts, data=json.loads(data))
            for seq, ts, data in rows]


def folded_count(db: Any, run_id: str) -> int:
    """How many progress events the run's rows stand for beyond themselves."""
    row = db.execute("SELECT COALESCE(SUM(folded - 1), 0) FROM progress WHERE run = ?",
                     [run_id]).fetchone()
    return int(row[0])
