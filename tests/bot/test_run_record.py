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


def _submitted(tmp_path: Path) -> tuple[Store, str]:
    from bot.manifest.load import load_manifest_file
    from bot.messages.model import RecordingNotifier
    from bot.service import PilotService
    from bot.settings import Settings
    from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest

    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    store = Store(settings.db_path)
    service = PilotService(settings, store, {"local": ScriptedDispatcher(
        pilot_script(["doc-01", "doc-02", "doc-03", "doc-04"]))}, RecordingNotifier())
    loaded = load_manifest_file(write_manifest(tmp_path))
    return store, service.submit(loaded, submitter="bob").run_id


def test_a_run_carries_its_plan_and_its_manifest_checked_once(tmp_path: Path) -> None:
    from decimal import Decimal

    from bot.manifest.model import Manifest
    from bot.pilot.plan import Plan

    store, run_id = _submitted(tmp_path)
    run, row = store.run(run_id), store.get_run(run_id)
    assert isinstance(run, RunRecord) and run.id == run_id and run.status == "planned"
    assert isinstance(run.plan, Plan) and run.plan.to_dict() == row["plan"]
    assert run.plan.lot_price_usd_per_day == Decimal(row["plan"]["lot_price_usd_per_day"])
    assert isinstance(run.manifest, Manifest) and run.manifest_problem is None
    assert run.manifest_json == row["manifest_json"]  # the checked manifest reads the same
    assert run.approvers == tuple(row["approvers"]) and run.submitter == "bob"
    assert store.expected_ids(run_id) == ["doc-01", "doc-02", "doc-03", "doc-04"]
    assert "expected_ids" not in row  # a table of their own (bot/store/expected.py)
    assert [r.id for r in store.runs()] == [run_id] == [store.find("latest").id]


def test_an_old_manifest_that_no_longer_validates_keeps_the_run_readable(
        tmp_path: Path) -> None:
    store, run_id = _submitted(tmp_path)
    old = {**store.get_run(run_id)["manifest_json"], "hardwre": {"gpu": "cpu"}}  # since renamed
    store.update_run(run_id, manifest_json=old)
    run = store.run(run_id)
    assert run.manifest is None and run.manifest_json == {} and run.plan is not None
    assert run.manifest_problem is not None and f"run {run_id}" in run.manifest_problem
    assert "hardwre" in run.manifest_problem


def test_a_plan_column_that_holds_no_plan_is_named_not_trusted(tmp_path: Path) -> None:
    store, run_id = _submitted(tmp_path)
    store.update_run(run_id, plan={"gpu": "cpu"})
    with pytest.raises(StoreError, match=f"run {run_id}: column plan does not hold a plan"):
        store.run(run_id)
    store.update_run(run_id, plan=None, verdict=["passed"])
    with pytest.raises(StoreError, match=f"run {run_id}: column verdict holds list"):
        store.run(run_id)


def test_a_stop_note_is_typed_once_and_a_broken_one_is_named(tmp_path: Path) -> None:
    from bot.pilot.record import StopNote

    store, run_id = _submitted(tmp_path)
    assert store.run(run_id).stop is None
    store.update_run(run_id, stop={"by": "alice", "reason": "wrong data",
                                   "at": "2026-12-03T10:00:00Z"})
    note = store.run(run_id).stop
    assert note == StopNote("alice", "wrong data", "2026-12-03T10:00:00Z")
    assert note.told() == "by alice at 2026-12-03T10:00:00Z: wrong data"
    store.update_run(run_id, stop={"by": "alice"})
    with pytest.raises(StoreError, match=f"run {run_id}: column stop holds .* not a stop note"):
        store.run(run_id)


def test_a_verdict_is_typed_once_with_its_checks(tmp_path: Path) -> None:
    from bot.pilot.record import Verdict, VerdictCheck

    store, run_id = _submitted(tmp_path)
    assert store.run(run_id).verdict is None
    store.update_run(run_id, verdict={"passed": True, "checks": [
        {"ok": True, "text": "accepted 4 ≥ 4 required"},
        {"ok": True, "warn": True, "text": "1 refusal outside expected_refusals"},
        "not a check"]})
    verdict = store.run(run_id).verdict
    assert verdict == Verdict(True, (VerdictCheck(True, "accepted 4 ≥ 4 required"),
                                     VerdictCheck(True, "1 refusal outside expected_refusals",
                                                  warn=True)))
    assert [(c.mark, c.style) for c in verdict.checks] == [("✓", "ok"), ("⚠", "warn")]
