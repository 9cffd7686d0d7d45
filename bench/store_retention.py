"""The bot's state database per million inputs: the layout before and now, and after a prune.

One volume run of N inputs (default 1,000,000) recorded as the follower records it: item
batches of 256, a progress event every second of a run at 20 inputs per second (50,000 of
them for 1M inputs, 80 workers' rates on every 30th, as runner/volume_progress.py sends them), its N
expected ids given at creation. Printed:

- the layout before (the expected ids one JSON cell of the run's row, every progress event a
  row of ``events``), built with the old schema by plain SQL, then opened by the ``Store``
  (the migration's time);
- the layout now (``Store.create_run`` and ``Store.record_events``): rows/s recorded, bytes per
  100,000 inputs;
- the same database once the run ended 40 days ago and was pruned and vacuumed.

The last line is the verdict: what the pruned run still takes in the database (its bytes
beyond an empty database's, after VACUUM) per 100,000 inputs; target at most 10 kB: its
row, stages and events, nothing that grows with its inputs.
Usage: .venv/bin/python bench/store_retention.py [N]; PREFLIGHT_BENCH_SMOKE=1: 10,000 inputs.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bot.store import Store  # noqa: E402
from bot.store.items import INSERT_ITEM, batch_rows  # noqa: E402
from runner.events import ITEM_FIELDS, Event  # noqa: E402

SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
WORKERS = 80
TARGET_PER_100K = 10_000
PER_SECOND = 20  # inputs a second: a progress event every 20 inputs
RUN = "20261001T000000000Z-bench-v1"
TS = "2026-10-01T00:00:00.000000+00:00"


def stream(n: int) -> list[Event]:
    """The run's events: run.started, then item batches with a progress every second."""
    out = [Event(1, "run.started", RUN, TS), Event(2, "stage.started", RUN, TS,
                                                   {"stage": "volume"})]
    seq = 2
    for start in range(0, n, PER_SECOND):
        items = []
        for i in range(start, min(n, start + PER_SECOND)):
            seq += 1
            items.append([seq, TS, f"doc-{i:07d}", "accepted", "invoice", None, 0.0012,
                          5120, {"output": f"outputs/shards/w3-b{start}.jsonl#{i - start}"}])
        out.append(Event(seq, "item.batch", RUN, TS, {"fields": list(ITEM_FIELDS),
                                                      "items": items}))
        seq += 1
        second = start // PER_SECOND
        data = {"done": min(n, start + PER_SECOND), "total": n, "items_per_s": 20.0,
                "eta_s": 1234.5, "held": 3, "held_s": 1.2, "held_limit_s": 60.0,
                "workers": WORKERS, "running_s": float(second)}
        if second % 30 == 0:
            data["per_card"] = {f"node-{w // 8}:gpu{w % 8}": 0.25 for w in range(WORKERS)}
        out.append(Event(seq, "progress", RUN, TS, data))
    out.append(Event(seq + 1, "stage.passed", RUN, TS, {"stage": "volume"}))
    out.append(Event(seq + 2, "run.finished", RUN, TS, {"status": "passed"}))
    return out


def size(path: Path) -> int:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path.stat().st_size


def before(path: Path, ids: list[str], events: list[Event]) -> int:
    """The old layout, by plain SQL: expected ids a JSON cell, each progress a row."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("""CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL,
        attempt INTEGER NOT NULL, kind TEXT NOT NULL DEFAULT 'pilot', parent_run TEXT,
        status TEXT NOT NULL, run_dir TEXT NOT NULL, created_at TEXT NOT NULL,
        finished_at TEXT, last_seq INTEGER NOT NULL DEFAULT 0, expected_ids TEXT,
        UNIQUE (name, attempt, kind))""")
    conn.execute("""CREATE TABLE events (run TEXT NOT NULL REFERENCES runs(id),
        seq INTEGER NOT NULL, type TEXT NOT NULL, ts TEXT NOT NULL, stage TEXT,
        data TEXT NOT NULL, PRIMARY KEY (run, seq))""")
    conn.execute("CREATE INDEX events_by_type ON events(run, type, seq)")
    conn.execute("CREATE TABLE run_keys (key INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE)")
    conn.execute("""CREATE TABLE items (run_key INTEGER NOT NULL, seq INTEGER NOT NULL,
        item_id TEXT NOT NULL, status TEXT, category TEXT, reason TEXT, ts TEXT, stage TEXT,
        elapsed_s REAL, input_bytes INTEGER, extra TEXT, PRIMARY KEY (run_key, seq))""")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO runs (id, name, attempt, kind, status, run_dir, created_at, "
                 "finished_at, last_seq, expected_ids) VALUES (?, 'bench', 1, 'volume', "
                 "'finished', '/tmp/x', ?, ?, ?, ?)",
                 [RUN, TS, TS, events[-1].seq, json.dumps(ids)])
    conn.execute("INSERT INTO run_keys (key, id) VALUES (1, ?)", [RUN])
    for e in events:
        if e.type == "item.batch":
            conn.executemany(INSERT_ITEM, batch_rows(1, e.data["items"], set()))
        else:
            conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
                         [RUN, e.seq, e.type, e.ts, e.stage, json.dumps(e.data,
                                                                          sort_keys=True)])
    conn.execute("COMMIT")
    conn.close()
    return size(path)


def main() -> int:
    n = 10_000 if SMOKE else int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    per = 100_000 / n
    ids = [f"doc-{i:07d}" for i in range(n)]
    events = stream(n)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old.db"
        old_bytes = before(old, ids, events)
        t = time.perf_counter()
        Store(old).close()
        migrate_s = time.perf_counter() - t
        print(f"before (expected ids a JSON cell, a row per progress): "
              f"{old_bytes / 1e6:.1f} MB, {old_bytes * per / 1e6:.2f} MB per 100k inputs; "
              f"migrated on open in {migrate_s:.2f} s")

        empty = Path(tmp) / "empty.db"
        Store(empty).vacuum()
        empty_bytes = size(empty)
        path = Path(tmp) / "new.db"
        store = Store(path)
        t = time.perf_counter()
        store.create_run({"id": RUN, "name": "bench", "attempt": 1, "kind": "volume",
                          "status": "running", "run_dir": "/tmp/x", "expected_ids": ids})
        ids_s = time.perf_counter() - t
        t = time.perf_counter()
        chunk: list[Event] = []
        for e in events:
            chunk.append(e)
            if len(chunk) >= 64:  # a follower's read: a few seconds' worth
                store.record_events(RUN, chunk, 0)
                chunk = []
        store.record_events(RUN, chunk, 0)
        record_s = time.perf_counter() - t
        assert store.event_count(RUN) == events[-1].seq
        new_bytes = size(path)
        print(f"now: expected ids {n / ids_s:,.0f} rows/s; items and events recorded "
              f"{n / record_s:,.0f} items/s; {new_bytes / 1e6:.1f} MB, "
              f"{new_bytes * per / 1e6:.2f} MB per 100k inputs "
              f"({len([e for e in events if e.type == 'progress'])} progress events: "
              f"{store.db.execute('SELECT COUNT(*) FROM progress').fetchone()[0]} row)")

        ended = datetime.now(timezone.utc) - timedelta(days=40)
        store.transition(RUN, ("running",), "finished", outcome="passed",
                         finished_at=ended.isoformat(timespec="seconds"))
        t = time.perf_counter()
        [run] = store.prunable(30, datetime.now(timezone.utc))
        pruned = store.prune_run(run.run)
        prune_s = time.perf_counter() - t
        store.vacuum()
        store.close()
        after = size(path)
        print(f"pruned ({pruned.items:,} item rows, {pruned.expected_ids:,} expected ids) in "
              f"{prune_s:.2f} s; after VACUUM {after / 1e3:.1f} kB, of which "
              f"{(after - empty_bytes) / 1e3:.1f} kB beyond an empty database's "
              f"{empty_bytes / 1e3:.1f} kB")
    value = (after - empty_bytes) * per
    verdict = "PASS" if value <= TARGET_PER_100K else "MISS"
    print(f"pruned_state_bytes_per_100k_inputs: {value:.0f} (target <= {TARGET_PER_100K}) "
          f"{verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
