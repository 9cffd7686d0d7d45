"""The expected ids as rows of their own and progress kept as each attempt's latest, and the
migration of a database made before either (bot/store/expected.py, bot/store/progress.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from bot.errors import RunNotFound, StoreError
from bot.store import Store
from bot.store import expected as expected_module
from runner.events import Event


def ev(seq: int, etype: str, **data: object) -> Event:
    return Event(seq, etype, "r1", f"2026-12-02T00:00:{seq:02d}+00:00", dict(data))


def new_run(store: Store, run_id: str = "r1", **more: object) -> None:
    store.create_run({"id": run_id, "name": run_id, "attempt": 1, "run_dir": "/tmp/x",
                      "status": "running", **more})


def test_expected_ids_are_rows_written_in_batches_and_read_streamed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(expected_module, "BATCH", 7)  # several batches each way
    store = Store(tmp_path / "p.db")
    ids = [f"doc-{n:03d}" for n in range(50, 0, -1)]  # the listing's order, not sorted
    new_run(store, expected_ids=(i for i in ids))  # any iterable: a generator too
    assert "expected_ids" not in store.get_run("r1")  # not a cell of the run's row
    stream = store.iter_expected_ids("r1")
    assert next(stream) == "doc-050"  # a generator: read as it goes
    assert [next(stream), *stream] == ids[1:]
    assert store.expected_ids("r1") == ids and store.expected_count("r1") == 50
    store.set_expected_ids("r1", ["b", "a"])  # replaced (a corpus listed on the head)
    assert store.expected_ids("r1") == ["b", "a"]
    new_run(store, "r2")
    assert store.expected_ids("r2") is None  # none recorded
    with pytest.raises(RunNotFound):
        store.expected_ids("nope")
    with pytest.raises(StoreError, match="set_expected_ids"):
        store.update_run("r1", expected_ids=["x"])


def test_progress_is_kept_as_each_attempts_latest_and_the_numbering_stays_whole(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store)
    first = [ev(1, "run.started"), ev(2, "stage.started", stage="pilot"),
             ev(3, "progress", done=1, total=9), ev(4, "progress", done=2, total=9)]
    assert [e.seq for e in store.record_events("r1", first, 10)] == [1, 2, 3, 4]
    more = [ev(5, "progress", done=3, total=9),
            ev(6, "run.started", resume=True), ev(7, "stage.started", stage="pilot"),
            ev(8, "progress", done=4, total=9)]
    assert [e.seq for e in store.record_events("r1", more, 20)] == [5, 6, 7, 8]
    # a line read again is not new, and never replaces a later one
    assert store.record_events("r1", [ev(4, "progress", done=2, total=9)], 20) == []
    events = store.events("r1")
    assert [e.seq for e in events] == [1, 2, 5, 6, 7, 8]  # each attempt's latest progress
    assert events[2] == more[0] and events[-1] == more[-1]
    assert store.events_of_type("r1", "progress") == [more[0], more[-1]]
    assert store.events_of_type("r1", "progress", after_seq=5) == [more[-1]]
    assert store.events("r1", after_seq=7) == [more[-1]]  # a dead runner's last event
    assert store.event_count("r1") == 8 == store.get_run("r1")["last_seq"]
    assert store.db.execute("SELECT COUNT(*) FROM events WHERE type = 'progress'"
                            ).fetchone()[0] == 0
    later = [ev(9, "progress", done=9, total=9), ev(10, "run.finished", status="passed")]
    store.record_events("r1", later, 30)
    assert store.events_of_type("r1", "progress") == [more[0], later[0]]
    assert store.event_count("r1") == 10


OLD_RUNS = """CREATE TABLE runs (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, attempt INTEGER NOT NULL,
    kind TEXT NOT NULL DEFAULT 'pilot', parent_run TEXT, status TEXT NOT NULL,
    outcome TEXT, stage_reached TEXT, first_error TEXT, verdict TEXT, balance TEXT,
    evidence TEXT, environment TEXT, plan TEXT, changes TEXT, manifest_text TEXT,
    manifest_json TEXT, spec_path TEXT, run_dir TEXT NOT NULL, node TEXT,
    submitter TEXT, channel TEXT, thread_ts TEXT, created_at TEXT NOT NULL,
    started_at TEXT, finished_at TEXT, last_seq INTEGER NOT NULL DEFAULT 0,
    events_offset INTEGER NOT NULL DEFAULT 0, last_event_at TEXT, pid INTEGER,
    expected_ids TEXT, expected_refusals TEXT, categories TEXT, success TEXT,
    approvers TEXT, two_person INTEGER NOT NULL DEFAULT 0, exit_code INTEGER,
    base_dir TEXT, project_dir TEXT, UNIQUE (name, attempt, kind))"""
OLD_EVENTS = """CREATE TABLE events (
    run TEXT NOT NULL REFERENCES runs(id), seq INTEGER NOT NULL, type TEXT NOT NULL,
    ts TEXT NOT NULL, stage TEXT, data TEXT NOT NULL, PRIMARY KEY (run, seq))"""


def _old_database(path: Path) -> list[str]:
    """A state database as the bot before this change made it: the expected ids a JSON cell
    of ``runs``, every progress event a row of ``events``. Returns the first run's ids."""
    ids = [f"doc-{n}" for n in (3, 1, 2)]
    conn = sqlite3.connect(path)
    conn.execute(OLD_RUNS)
    conn.execute(OLD_EVENTS)
    for run, cell in (("r1", json.dumps(ids)), ("r2", None)):
        conn.execute("INSERT INTO runs (id, name, attempt, status, run_dir, created_at, "
                     "expected_ids, last_seq) VALUES (?, 'demo', ?, 'finished', '/tmp/x', "
                     "'2026-12-01T00:00:00+00:00', ?, 6)", [run, int(run[1]), cell])
    kinds = ["run.started", "progress", "progress", "run.started", "progress", "run.finished"]
    for run in ("r1", "r2"):
        for seq, kind in enumerate(kinds, 1):
            conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, NULL, ?)",
                         [run, seq, kind, f"t{seq}", json.dumps({"done": seq})])
    conn.commit()
    conn.close()
    return ids


def test_a_database_from_before_is_migrated_on_open_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    ids = _old_database(path)
    store = Store(path)
    assert store.expected_ids("r1") == ids and store.expected_ids("r2") is None
    assert "expected_ids" not in store.db["runs"].columns_dict  # moved, column dropped
    for run in ("r1", "r2"):
        assert [(e.seq, e.type) for e in store.events(run)] == [
            (1, "run.started"), (3, "progress"), (4, "run.started"), (5, "progress"),
            (6, "run.finished")]
        assert store.event_count(run) == 6
    assert store.events_of_type("r1", "progress")[0].data == {"done": 3}
    store.close()
    again = Store(path)  # opened again: nothing to move, nothing lost or doubled
    assert again.expected_ids("r1") == ids
    assert again.event_count("r1") == 6 and len(again.events("r1")) == 5
    assert again.run("r1").status == "finished"
