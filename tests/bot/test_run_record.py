"""The store's typed run record: read once from the row, checked, then trusted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.errors import RunNotFound, StoreError
from bot.store import RunRecord, Store


def test_a_run_leaves_the_store_as_a_typed_record(tmp_path: Path) -> None:
    store = Store(tmp_path / "state" / "preflight.db")
    store.create_run({"id": "r1", "name": "demo", "attempt": 2, "kind": "volume",
                      "run_dir": str(tmp_path / "runs" / "r1"),
                      "spec_path": str(tmp_path / "runs" / "r1" / "spec.json"),
                      "project_dir": str(tmp_path), "node": {"kind": "ssh", "host": "gpu-1"},
                      "expected_ids": [f"doc-{n}" for n in range(1000)]})
    store.update_run("r1", pid=4242, events_offset=120, last_seq=7)
    record = store.run_record("r1")
    assert isinstance(record, RunRecord)
    assert (record.id, record.name, record.attempt, record.kind, record.status) == \
        ("r1", "demo", 2, "volume", "planned")
    assert record.run_dir == tmp_path / "runs" / "r1" and record.project_dir == tmp_path
    assert (record.pid, record.events_offset, record.last_seq, record.resume_seq) == \
        (4242, 120, 7, 0)
    assert record.node_kind == "ssh" and record.node == {"kind": "ssh", "host": "gpu-1"}
    assert record == RunRecord.from_row(store.get_run("r1"))  # the full row reads the same
    with pytest.raises(RunNotFound):
        store.run_record("r2")


def test_a_row_that_holds_the_wrong_type_is_named_not_trusted() -> None:
    row = {"id": "r1", "name": "demo", "attempt": 1, "kind": "pilot", "status": "running",
           "run_dir": "/runs/r1", "created_at": "2026-12-03T00:00:00+00:00"}
    assert RunRecord.from_row(row).node_kind == "local"  # no node: the bot host
    with pytest.raises(StoreError, match="run r1: column pid holds str '12', not int"):
        RunRecord.from_row({**row, "pid": "12"})
    with pytest.raises(StoreError, match="run r1: .* has no run_dir"):
        RunRecord.from_row({k: v for k, v in row.items() if k != "run_dir"})
