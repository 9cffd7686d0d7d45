"""Retention on the bot host: an ended run's item rows, expected ids and progress pruned after
N days, nothing else (bot/store/retention.py, bot/service/retention.py, `preflight store`)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot import schedule
from bot.cli.app import app
from bot.errors import DispatchError, PreflightError
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from runner.events import Event

NOW = datetime(2026, 12, 5, 8, 0, tzinfo=timezone.utc)
OLD, RECENT, RUNNING = ("20261001T000000000Z-demo-a1", "20261201T000000000Z-demo-a2",
                        "20261204T000000000Z-demo-a3")
ITEMS = 12


def _events(run_id: str) -> list[Event]:
    ts = "2026-12-01T00:00:00+00:00"
    items = [Event(2 + 2 * n, "item.done", run_id, ts,
                   {"id": f"doc-{n:02d}", "status": "accepted", "category": "x",
                    "stage": "pilot"}) for n in range(ITEMS)]
    progress = [Event(3 + 2 * n, "progress", run_id, ts, {"done": n + 1, "total": ITEMS})
                for n in range(ITEMS)]
    return sorted([Event(1, "run.started", run_id, ts), *items, *progress],
                  key=lambda e: e.seq)


def _run(store: Store, run_id: str, attempt: int, status: str, ended: datetime | None,
         tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "balance.csv").write_text("id,status,category,reason\n" + "".join(
        f"doc-{n:02d},accepted,x,\n" for n in range(ITEMS)))
    store.create_run({"id": run_id, "name": "demo", "attempt": attempt, "status": "running",
                      "run_dir": str(run_dir),
                      "expected_ids": [f"doc-{n:02d}" for n in range(ITEMS)]})
    store.record_events(run_id, _events(run_id), 100)
    if status != "running":
        store.transition(run_id, ("running",), status, outcome="failed",
                         balance={"accepted": ITEMS, "refused": 0, "total": ITEMS,
                                  "ok": True, "problems": [], "items_total": ITEMS,
                                  "items": [{"id": "doc-00", "status": "accepted",
                                             "category": "x", "reason": None}]},
                         finished_at=ended.isoformat(timespec="seconds") if ended else None)


@pytest.fixture()
def service(tmp_path: Path) -> PilotService:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    store = Store(settings.db_path)
    _run(store, OLD, 1, "stopped", NOW - timedelta(days=40), tmp_path)
    _run(store, RECENT, 2, "finished", NOW - timedelta(days=3), tmp_path)
    _run(store, RUNNING, 3, "running", None, tmp_path)
    return PilotService(settings, store, {}, RecordingNotifier())


def _rows(store: Store, run_id: str) -> tuple[int, int, int]:
    [rows] = store.run_rows(run_id)
    return rows.items, rows.expected_ids, rows.progress


def test_prune_removes_only_the_old_ended_runs_items_and_progress(
        service: PilotService) -> None:
    store = service.store
    before = {r: store.events(r) for r in (OLD, RECENT, RUNNING)}
    assert [r.run for r in service.retention.usage(now=NOW).prunable] == [OLD]
    dry = service.retention.prune(now=NOW, dry_run=True)
    assert [r.run for r in dry.runs] == [OLD] and not dry.pruned
    assert _rows(store, OLD) == (ITEMS, ITEMS, 1)  # a dry run deletes nothing
    done = service.retention.prune(now=NOW)
    assert [(p.run, p.items, p.expected_ids, p.progress) for p in done.pruned] == [
        (OLD, ITEMS, ITEMS, 1)]
    assert _rows(store, OLD) == (0, 0, 0)
    assert _rows(store, RECENT) == _rows(store, RUNNING) == (ITEMS, ITEMS, 1)
    # what stays: the run row, its balance summary, its other events, the files on disk
    old = store.run(OLD)
    assert old.items_pruned_at and old.balance and old.balance.accepted == ITEMS
    assert store.events(OLD) == [e for e in before[OLD]
                                 if e.type not in ("item.done", "progress")]
    assert store.events(RECENT) == before[RECENT] and store.events(RUNNING) == before[RUNNING]
    assert (old.run_dir / "balance.csv").is_file()
    assert service.retention.prune(now=NOW).runs == []  # pruned once: nothing again
    # later, the recent run's turn; the running one is never pruned however old
    later = service.retention.prune(now=NOW + timedelta(days=60))
    assert [r.run for r in later.runs] == [RECENT]
    assert _rows(store, RUNNING) == (ITEMS, ITEMS, 1)


def test_a_pruned_run_still_shows_its_balance_and_says_when_and_where(
        service: PilotService, monkeypatch: pytest.MonkeyPatch) -> None:
    service.retention.prune(now=NOW)
    [balance] = [m for m in service.publisher.thread_messages(OLD) if m.key == "balance"]
    text = " ".join(str(b) for b in balance.blocks)
    assert "Item rows pruned from the state database on " in text
    assert str(service.store.run(OLD).run_dir / "balance.csv") in text
    [recent] = [m for m in service.publisher.thread_messages(RECENT) if m.key == "balance"]
    assert "pruned" not in " ".join(str(b) for b in recent.blocks)
    [decision] = [m for m in service.publisher.thread_messages(OLD) if m.key == "decision"]
    assert "can no longer be resumed" in " ".join(str(b) for b in decision.blocks)
    with pytest.raises(DispatchError, match="item rows were pruned .* submit the manifest"):
        service.resume(OLD)
    with pytest.raises(PreflightError, match="report written now would lack them"):
        service.publisher.write_report(OLD, strict=True)
    monkeypatch.setenv("PREFLIGHT_HOME", str(service.settings.home))
    monkeypatch.setenv("COLUMNS", "200")
    shown = CliRunner().invoke(app, ["show", OLD])
    assert shown.exit_code == 0, shown.output
    assert "Item rows pruned" in shown.output and "balance.csv" in shown.output
    listed = CliRunner().invoke(app, ["runs"])
    assert listed.exit_code == 0, listed.output
    [line] = [ln for ln in listed.output.splitlines() if ln.startswith(OLD.split("-")[0])]
    assert "[item rows pruned 20" in line
    as_json = json.loads(CliRunner().invoke(app, ["runs", "--json"]).output)
    assert [r["items_pruned_at"] is not None for r in as_json] == [False, False, True]


def test_the_store_command_shows_sizes_and_prunes(
        service: PilotService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFLIGHT_HOME", str(service.settings.home))
    monkeypatch.setenv("COLUMNS", "200")
    # the command's "now" is the clock's: between the old run's age and the recent one's
    days = (datetime.now(timezone.utc) - NOW).days + 20
    shown = CliRunner().invoke(app, ["store", "--older-than", str(days)])
    assert shown.exit_code == 0, shown.output
    assert "items" in shown.output and "expected_ids" in shown.output
    assert "a prune now would remove the rows of 1 run(s)" in shown.output
    usage = json.loads(CliRunner().invoke(app, ["store", "--json"]).output)
    assert {t["name"] for t in usage["tables"]} >= {"runs", "items", "expected_ids",
                                                    "progress", "events"}
    assert usage["retention_days"] == 30 and OLD in usage["prunable"]
    assert RUNNING not in usage["prunable"]
    dry = CliRunner().invoke(app, ["store", "prune", "--older-than", "1", "--dry-run"])
    assert dry.exit_code == 0 and "would prune 2 run(s)" in dry.output, dry.output
    assert _rows(service.store, OLD) == (ITEMS, ITEMS, 1)
    done = CliRunner().invoke(app, ["store", "prune", "--older-than", "1", "--vacuum"])
    assert done.exit_code == 0 and "pruned 2 run(s)" in done.output, done.output
    assert "vacuumed" in done.output
    assert _rows(service.store, OLD) == _rows(service.store, RECENT) == (0, 0, 0)
    monkeypatch.setenv("PREFLIGHT_RETENTION_DAYS", "0")
    kept = CliRunner().invoke(app, ["store", "prune"])
    assert kept.exit_code == 2 and "kept for ever" in kept.output


def test_the_daily_job_prunes_by_the_setting_and_0_keeps_for_ever(
        service: PilotService) -> None:
    forever = PilotService(service.settings.with_(retention_days=0.0), service.store, {},
                           RecordingNotifier())
    assert schedule.prune_store(forever, NOW + timedelta(days=999)) == 0
    assert _rows(service.store, OLD) == (ITEMS, ITEMS, 1)
    assert schedule.prune_store(service, NOW) == 1  # the default: 30 days
    assert _rows(service.store, OLD) == (0, 0, 0)


def test_a_pilot_is_pruned_only_with_its_volume(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    ended = (NOW - timedelta(days=90)).isoformat(timespec="seconds")
    for run_id, kind, parent, status in (("p1", "pilot", None, "decided"),
                                         ("v1", "volume", "p1", "stopped")):
        store.create_run({"id": run_id, "name": "demo", "attempt": 1, "kind": kind,
                          "parent_run": parent, "status": status, "run_dir": "/tmp/x",
                          "finished_at": ended})
    store.update_run("v1", finished_at=None, created_at=NOW.isoformat())  # a recent start
    assert [r.run for r in store.prunable(30, NOW)] == []  # the volume may resume
    store.update_run("v1", created_at=ended)
    assert sorted(r.run for r in store.prunable(30, NOW)) == ["p1", "v1"]


def test_the_setting_is_days_0_or_more() -> None:
    home = {"PREFLIGHT_HOME": "/tmp"}
    assert Settings.from_env(home).retention_days == 30
    assert Settings.from_env({**home, "PREFLIGHT_RETENTION_DAYS": "0"}).retention_days == 0
    assert Settings.from_env({**home, "PREFLIGHT_RETENTION_DAYS": "7.5"}).retention_days == 7.5
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(PreflightError, match="PREFLIGHT_RETENTION_DAYS"):
            Settings.from_env({**home, "PREFLIGHT_RETENTION_DAYS": bad})


def test_rows_go_in_chunks_and_a_prune_cut_short_is_finished_by_the_next(
        service: PilotService) -> None:
    store = service.store
    done = store.prune_run(OLD, chunk=5)  # ITEMS rows over 5-seq ranges: several chunks
    assert (done.items, done.expected_ids, done.progress) == (ITEMS, ITEMS, 1)
    assert _rows(store, OLD) == (0, 0, 0)
    # a prune stopped after its mark, its rows not yet deleted (the bot killed mid-way)
    store.db.execute("UPDATE runs SET items_pruned_at = '2026-12-01T00:00:00+00:00' "
                     "WHERE id = ?", [RECENT])
    store.db.execute("UPDATE runs SET finished_at = '2026-10-01T00:00:00+00:00' "
                     "WHERE id = ?", [RECENT])
    assert [r.run for r in store.prunable(30, NOW)] == [RECENT]
    [again] = service.retention.prune(now=NOW).pruned
    assert (again.run, again.items, again.at) == (RECENT, ITEMS, "2026-12-01T00:00:00+00:00")
    assert store.prunable(30, NOW) == []


def test_watch_once_runs_the_retention_too(service: PilotService,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFLIGHT_HOME", str(service.settings.home))
    monkeypatch.setenv("COLUMNS", "200")
    done = CliRunner().invoke(app, ["watch", "--once"])
    assert done.exit_code == 0, done.output
    assert "retention: pruned the item rows of 1 run(s)" in done.output
    assert _rows(service.store, OLD) == (0, 0, 0)
    assert _rows(service.store, RECENT) == (ITEMS, ITEMS, 1)
