"""The store: atomic event recording, conditional transitions, one connection per thread."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from bot.errors import RunNotFound, StoreError
from bot.store import Store
from runner.events import ITEM_FIELDS, Event, EventFormatError, EventWriter, read_events


def new_run(store: Store, run_id: str = "r1", status: str = "running", attempt: int = 1) -> None:
    store.create_run({"id": run_id, "name": "demo", "attempt": attempt, "run_dir": "/tmp/x",
                      "status": status})


def ev(seq: int, etype: str, **data: object) -> Event:
    return Event(seq, etype, "r1", f"2026-12-02T00:00:{seq:02d}+00:00", dict(data))


def test_wal_and_schema(tmp_path: Path) -> None:
    store = Store(tmp_path / "state" / "p.db")
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {"runs", "events", "stages", "items", "decisions", "message_refs"} <= set(
        store.db.table_names())


def test_record_events_is_idempotent_and_derives_stages(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store)
    batch = [ev(1, "run.started"), ev(2, "stage.started", stage="torch"),
             ev(3, "stage.failed", stage="torch",
                error={"type": "ImportError", "message": "no torch"}),
             ev(4, "stage.skipped", stage="device", reason="torch failed"),
             ev(5, "item.done", id="a", status="accepted", category="x")]
    assert [e.seq for e in store.record_events("r1", batch, 500)] == [1, 2, 3, 4, 5]
    assert store.record_events("r1", batch, 500) == []
    run = store.get_run("r1")
    assert (run["last_seq"], run["events_offset"], run["stage_reached"]) == (5, 500, "torch")
    assert run["first_error"] == {"stage": "torch", "type": "ImportError", "message": "no torch"}
    states = {s["stage"]: s["state"] for s in store.stages("r1")}
    assert states == {"torch": "failed", "device": "skipped"}
    assert [i["id"] for i in store.items("r1")] == ["a"]


def test_item_events_are_kept_once_and_read_back_whole_in_seq_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store)
    batch = [ev(1, "stage.started", stage="pilot"),
             ev(2, "item.done", stage="pilot", id="a", status="accepted", category="x",
                input_bytes=12, elapsed_s=0.25),
             ev(3, "item.done", stage="pilot", id="b", status="refused", reason="empty",
                input_bytes=0, output={"n": 1}, replayed=True),
             ev(4, "progress", stage="pilot", done=2, total=2)]
    store.record_events("r1", batch, 10)
    assert store.events("r1") == batch
    assert store.events("r1", after_seq=2) == batch[2:]
    assert store.events_of_type("r1", "item.done") == batch[1:3]
    assert store.events_of_type("r1", "item.done", after_seq=2) == [batch[2]]
    # recorded once: in items, not a second time as JSON in events; the progress as its
    # attempt's latest (bot/store/progress.py)
    assert store.db.execute("SELECT count(*) FROM events").fetchone()[0] == 1
    assert store.db.execute("SELECT count(*) FROM progress").fetchone()[0] == 1
    assert store.event_count("r1") == 4
    assert store.record_events("r1", batch, 10) == []  # an item seq already known is skipped
    assert [i["id"] for i in store.items("r1")] == ["a", "b"]


def test_an_item_run_again_after_its_output_was_lost_is_read_as_a_rerun(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store)
    store.record_events("r1", [
        ev(1, "item.done", id="a", status="accepted", category="x",
           output="outputs/shards/a1-w2-000001.jsonl#1"),
        ev(2, "item.done", id="b", status="accepted", category="x"),
        ev(3, "item.done", id="a", status="accepted", category="y", rerun=True,
           output="outputs/shards/a2-w0-000001.jsonl#1"),
        ev(4, "item.done", id="b", status="refused", reason="x", rerun=1,
           output="outputs/shards/forged.jsonl#1"),  # not JSON true: not a rerun
        ev(5, "item.done", id="a", status="accepted", category="y", replayed=True,
           output="outputs/shards/a1-w2-000001.jsonl#1")], 10)
    items = list(store.iter_items("r1"))
    assert [(i["id"], i.get("rerun")) for i in items] == [
        ("a", None), ("b", None), ("a", True), ("b", None), ("a", None)]
    # the outcome the balance counts: a's rerun (its first shard was lost), b's first
    assert store.item_output("r1", "a") == ("accepted", "outputs/shards/a2-w0-000001.jsonl#1")
    assert store.item_output("r1", "b") == ("accepted", None)


def test_an_item_batch_is_recorded_row_by_row_and_read_back_as_its_item_events(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store)
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path), "r1")
    writer.emit("stage.started", stage="pilot")
    emitted = [writer.emit("item.done", id="a", status="accepted", category="x",
                           input_bytes=12, elapsed_s=0.25),
               writer.emit("item.done", id="b", status="refused", reason="empty",
                           stage="pilot", output={"n": 1}, replayed=True)]
    writer.emit("progress", done=2, total=2)
    writer.close()
    raw, offset = read_events(str(path), expand=False)
    assert [e.type for e in raw] == ["stage.started", "item.batch", "progress"]
    assert [e.type for e in store.record_events("r1", raw, offset)] == [
        "stage.started", "item.batch", "progress"]
    assert store.events("r1") == read_events(str(path))[0]  # as if read one by one
    assert store.events_of_type("r1", "item.done") == emitted
    assert store.db.execute("SELECT count(*) FROM events").fetchone()[0] == 1  # + progress
    assert store.db.execute("SELECT stage, extra FROM items WHERE seq = 3").fetchone() == (
        "pilot", '{"output": {"n": 1}, "replayed": true}')
    assert [tuple(o) for o in store.item_outcomes("r1")] == [
        ("a", "accepted", emitted[0].ts, 0.25, 12), ("b", "refused", emitted[1].ts, None, None)]
    assert store.record_events("r1", raw, offset) == []  # read again: nothing new
    # a batch of which one item is known already: only the other is new
    later = Event(5, "item.batch", "r1", "t5", {**raw[1].data, "items": [
        raw[1].data["items"][1], [5, "t5", "c", "accepted", "x", None, None, None, None]]})
    assert store.record_events("r1", [later], offset + 1) == [later]
    assert [i["id"] for i in store.items("r1")] == ["a", "b", "c"]
    assert store.get_run("r1")["last_seq"] == 5


def test_two_runs_items_with_the_same_seqs_stay_apart(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store, "r1")
    new_run(store, "r2", attempt=2)
    assert store.items("r2") == [] and store.events("r2") == []  # no key yet: nothing
    store.record_events("r1", [ev(1, "item.done", id="a", status="accepted", category="x")], 9)
    store.record_events("r2", [Event(1, "item.done", "r2", "t", {"id": "b", "status":
                                                                 "refused", "reason": "r"})], 9)
    assert [i["id"] for i in store.items("r1")] == ["a"]
    assert [(e.run, e.data["id"]) for e in store.events("r2")] == [("r2", "b")]
    again = Store(tmp_path / "p.db")  # a restarted bot finds the same keys
    assert [i["id"] for i in again.items("r2")] == ["b"]


def test_a_malformed_item_batch_records_nothing_and_is_named(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store)
    bad = Event(3, "item.batch", "r1", "t", {"fields": list(ITEM_FIELDS), "items": [
        [2, "t", "a", "accepted", "x", None, None, None, None], [3, "t", "b"]]})
    with pytest.raises(EventFormatError, match="item.batch seq 3: item 1"):
        store.record_events("r1", [ev(1, "run.started"), bad], 100)
    assert store.events("r1") == [] and store.get_run("r1")["events_offset"] == 0


def test_item_events_recorded_by_an_older_bot_still_read_once(tmp_path: Path) -> None:
    """A database from before: items without the event's columns, the event in events."""
    path = tmp_path / "p.db"
    new_run(Store(path))
    old = sqlite3.connect(path)
    old.executescript("""
        DROP TABLE items;
        CREATE TABLE items (run TEXT NOT NULL, seq INTEGER NOT NULL, item_id TEXT NOT NULL,
            status TEXT, category TEXT, reason TEXT, PRIMARY KEY (run, seq));
        INSERT INTO events VALUES ('r1', 1, 'item.done', '2026-12-02T00:00:01+00:00', 'pilot',
            '{"category": "x", "elapsed_s": 0.5, "id": "a", "input_bytes": 7, "stage": "pilot",
              "status": "accepted"}');
        INSERT INTO items VALUES ('r1', 1, 'a', 'accepted', 'x', NULL);""")
    old.commit()
    old.close()
    store = Store(path)
    later = ev(2, "item.done", stage="pilot", id="b", status="accepted", category="x",
               elapsed_s=0.25, input_bytes=3)
    store.record_events("r1", [ev(1, "item.done", stage="pilot", id="a", status="accepted",
                                  category="x"), later], 20)
    assert [(e.seq, e.data["id"], e.ts) for e in store.events("r1")] == [
        (1, "a", "2026-12-02T00:00:01+00:00"), (2, "b", later.ts)]
    assert [e.seq for e in store.events_of_type("r1", "item.done")] == [1, 2]
    assert [tuple(o) for o in store.item_outcomes("r1")] == [  # timings for the forecast
        ("a", "accepted", "2026-12-02T00:00:01+00:00", 0.5, 7),
        ("b", "accepted", later.ts, 0.25, 3)]
    assert [i["id"] for i in store.items("r1")] == ["a", "b"]


def test_failed_batch_records_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store)
    good = ev(1, "run.started")
    bad = Event(2, "item.done", "r1", "ts",  # an output that is not JSON-serialisable
                {"id": "a", "status": "accepted", "output": object()})
    with pytest.raises(TypeError):
        store.record_events("r1", [good, bad], 100)
    assert store.events("r1") == [] and store.get_run("r1")["events_offset"] == 0


def test_transition_is_conditional(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store, status="awaiting_decision")
    results: list[bool] = []
    barrier = threading.Barrier(4)

    def click() -> None:
        barrier.wait(timeout=10)
        results.append(store.decide_run("r1", {"decision": "approve", "reason": "ok",
                                               "by": "alice"}) is not None)

    threads = [threading.Thread(target=click) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [False, False, False, True]
    assert len(store.decisions("r1")) == 1
    assert store.transition("r1", ["awaiting_decision"], "running") is False


def test_lookup_by_prefix_and_missing(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store, "20261202T1-demo-a1")
    new_run(store, "20261202T2-demo-a2", attempt=2)
    with pytest.raises(StoreError, match="UNIQUE"):
        new_run(store, "20261202T3-demo-a2", attempt=2)
    assert store.find_run("20261202T1")["id"] == "20261202T1-demo-a1"
    with pytest.raises(RunNotFound):
        store.find_run("20261202T")  # ambiguous
    with pytest.raises(RunNotFound):
        store.get_run("nope")


def test_unwritable_state_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="state directory"):
        Store(blocker / "sub" / "p.db")
    assert isinstance(sqlite3.sqlite_version, str)


def test_the_store_makes_only_the_changes_the_table_lists(tmp_path: Path) -> None:
    from bot.pilot.states import TRANSITIONS, RunStatus

    store = Store(tmp_path / "p.db")
    new_run(store, status="planned")
    for to_state in ("running", "awaiting_decision", "decided", "finished", "stopped"):
        assert store.transition("r1", ["planned"], to_state) is False  # not in the table
        assert store.get_run("r1")["status"] == "planned"
    assert store.transition("r1", ["planned"], "dispatching") is True
    store.transition("r1", ["dispatching"], "running")
    store.transition("r1", ["running"], "awaiting_decision")
    assert store.decide_run("r1", {"decision": "revise", "reason": "r", "by": "a"}) is not None
    assert TRANSITIONS[RunStatus.DECIDED] == frozenset()  # decided is final
    assert store.transition("r1", list(RunStatus), "dispatching") is False
    assert store.get_run("r1")["status"] == "decided"
    with pytest.raises(StoreError, match="transition"):
        store.update_run("r1", status="running")  # no way around the table


def test_running_on_node_finds_the_node_of_a_run_and_of_a_volumes_workers(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    head = {"kind": "ssh", "host": "Head.example", "port": 22}
    worker = {"kind": "ssh", "host": "worker.example", "port": 2222}
    store.create_run({"id": "vol", "name": "demo", "attempt": 1, "run_dir": "/tmp/v",
                      "status": "running", "node": head,
                      "manifest_json": {"volume": {"nodes": [head, worker]}}})
    store.create_run({"id": "old-form", "name": "demo", "attempt": 2, "run_dir": "/tmp/o",
                      "status": "running", "node": {"kind": "local"},
                      "manifest_json": {"volume": {"nodes": 1}}})
    store.create_run({"id": "done", "name": "demo", "attempt": 3, "run_dir": "/tmp/d",
                      "status": "finished", "node": head})
    assert store.running_on_node("head.example") == ["vol"]
    assert store.running_on_node("worker.example", 2222) == ["vol"]
    assert store.running_on_node("worker.example") == []  # another port, another node
    assert store.running_on_node("elsewhere.example") == []
