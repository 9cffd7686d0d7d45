"""Scheduled jobs called with an explicit "now": stall watch, lease and evidence reminders."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bot.errors import PreflightError
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.pilot.leases import parse_time
from bot.schedule import BotScheduler, check_leases, remind_evidence, watch_runs
from bot.service import PilotService
from bot.service.leases import set_state
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest

JOB_IDS = ["preflight-evidence", "preflight-leases", "preflight-retention", "preflight-watch"]

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]
NODE = "gpu-1.example.net"
START = "2026-03-01T08:00:00+00:00"
END = datetime(2026, 3, 4, 8, tzinfo=timezone.utc)


def make(tmp_path: Path, script: Any, **kw: Any) -> PilotService:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = ScriptedDispatcher(script, **kw)
    return PilotService(settings, Store(settings.db_path),
                        {"local": dispatcher, "ssh": dispatcher}, RecordingNotifier())


def start(service: PilotService, tmp_path: Path, *, ssh: bool = False, name: str = "demo",
          port: int = 22) -> str:
    extra = (f"node: {{kind: ssh, host: {NODE}, port: {port}, workdir: /w, "
             "stall_after_s: 300}\n"
             f"lease: {{starts_at: '{START}'}}" if ssh else "")
    root = tmp_path / name
    loaded = load_manifest_file(write_manifest(root, name=name, extra=extra))
    run_id = service.submit(loaded, submitter="bob").run_id
    service.starter.start(run_id)
    return run_id


def published(service: PilotService) -> list[str]:
    return [m.key for m in service.publisher.notifier.history if m.key.startswith("alert")]  # type: ignore[attr-defined]


def test_stall_alert_once_then_recovery_once(tmp_path: Path) -> None:
    script = pilot_script(IDS, refuse=())
    service = make(tmp_path, lambda run: script, step=3)
    run_id = start(service, tmp_path, ssh=True)
    fake: ScriptedDispatcher = service.dispatchers["ssh"]  # type: ignore[assignment]
    fake.stalled.add(run_id)  # the runner goes silent but stays alive
    t0 = datetime.now(timezone.utc)
    assert watch_runs(service, t0) == []
    assert watch_runs(service, t0 + timedelta(seconds=299)) == []
    [alert] = watch_runs(service, t0 + timedelta(seconds=301))
    assert alert.key == "alert-stall" and alert.run_id == run_id
    assert "stall_after 300 s" in alert.summary
    assert watch_runs(service, t0 + timedelta(seconds=900)) == []
    fake.stalled.discard(run_id)
    [back] = watch_runs(service, t0 + timedelta(seconds=901))
    assert back.key == "alert-recovered"
    assert watch_runs(service, t0 + timedelta(seconds=902)) == []
    assert published(service) == ["alert-stall", "alert-recovered"]


def test_watch_closes_a_run_whose_runner_died_unseen(tmp_path: Path) -> None:
    service = make(tmp_path, lambda run: pilot_script(IDS, refuse=(), finish=False), step=100)
    run_id = start(service, tmp_path)
    now = datetime.now(timezone.utc)
    watch_runs(service, now)
    watch_runs(service, now + timedelta(seconds=5))
    run = service.store.get_run(run_id)
    assert (run["status"], run["first_error"]["type"]) == ("awaiting_decision", "RunnerExited")


def test_watch_pumps_runs_nobody_follows(tmp_path: Path) -> None:
    service = make(tmp_path, lambda run: pilot_script(IDS, refuse=()), step=100)
    run_id = start(service, tmp_path)
    watch_runs(service, datetime.now(timezone.utc))
    assert service.follower.ends.wait(run_id, 30)  # its end runs off the watch's thread
    assert service.store.get_run(run_id)["status"] == "awaiting_decision"


def _lease(service: PilotService, state: str = "provisioned", node: str = NODE) -> None:
    for s in ("ordered", "payment-notified", "funds-confirmed", "provisioned")[
            : ("ordered", "payment-notified", "funds-confirmed", "provisioned").index(state) + 1]:
        set_state(service.store, node, s, "alice", starts_at=START, days=3)


def test_lease_reminders_24h_and_2h_once_each_listing_what_is_not_secured(tmp_path: Path) -> None:
    service = make(tmp_path, lambda run: pilot_script(IDS, refuse=()), step=100)
    _lease(service)
    run_id = start(service, tmp_path, ssh=True)
    service.follower.follow(run_id, timeout=30)
    assert check_leases(service, END - timedelta(hours=25)) == []
    [day] = check_leases(service, END - timedelta(hours=23))
    assert day.key == "alert-lease-remind-24" and day.run_id == run_id
    body = " ".join(getattr(b, "text", "") for b in day.blocks)
    assert f"{run_id}: evidence not verified" in body and f"{run_id}: decision not taken" in body
    assert check_leases(service, END - timedelta(hours=22)) == []
    [two] = check_leases(service, END - timedelta(hours=1))
    assert two.key == "alert-lease-remind-2"
    assert check_leases(service, END - timedelta(minutes=30)) == []
    [ended] = check_leases(service, END + timedelta(minutes=1))
    assert ended.key == "alert-lease-end-end"
    lease = service.store.current_lease(NODE)
    assert lease["state"] == "ended"
    assert service.store.lease_changes(lease["id"])[-1]["by"] == "preflight"
    assert check_leases(service, END + timedelta(hours=5)) == []


def test_a_reminder_missed_during_downtime_is_sent_late_only_the_closest(tmp_path: Path) -> None:
    service = make(tmp_path, lambda run: [])
    _lease(service, "funds-confirmed")
    sent = check_leases(service, END - timedelta(hours=1, minutes=30))
    assert [m.key for m in sent] == ["alert-lease-remind-2"]
    assert sent[0].run_id == f"lease-{NODE}"  # no run on the node yet
    assert "Everything is secured" in " ".join(getattr(b, "text", "") for b in sent[0].blocks)
    assert check_leases(service, END - timedelta(hours=1)) == []


def test_evidence_reminder_once_after_30_minutes(tmp_path: Path) -> None:
    service = make(tmp_path, lambda run: pilot_script(IDS, refuse=()), step=100)
    run_id = start(service, tmp_path)
    service.follower.follow(run_id, timeout=30)
    balance_at = parse_time(service.store.events_of_type(run_id, "balance")[-1].ts)
    assert remind_evidence(service, balance_at + timedelta(minutes=29)) == []
    [reminder] = remind_evidence(service, balance_at + timedelta(minutes=31))
    assert reminder.key == "alert-evidence" and reminder.run_id == run_id
    assert remind_evidence(service, balance_at + timedelta(hours=3)) == []


def test_no_evidence_reminder_when_the_evidence_is_verified(tmp_path: Path) -> None:
    def script(run: str) -> list[dict[str, Any]]:
        events = pilot_script(IDS, refuse=())
        events.insert(-1, {"type": "evidence", "dest": "/x", "files": 3, "verified": True})
        return events

    service = make(tmp_path, script, step=100)
    run_id = start(service, tmp_path)
    service.follower.follow(run_id, timeout=30)
    assert remind_evidence(service, datetime.now(timezone.utc) + timedelta(hours=1)) == []


def test_jobs_persist_with_fixed_ids_and_one_scheduler_per_job_store(tmp_path: Path) -> None:
    service = make(tmp_path, lambda run: [])
    first = BotScheduler(service.settings, service)
    first.start(paused=True)
    try:
        jobs = {j.id: j for j in first.scheduler.get_jobs()}
        assert sorted(jobs) == JOB_IDS
        assert all(j.coalesce and j.misfire_grace_time is None for j in jobs.values())
        assert jobs["preflight-watch"].func_ref == "bot.schedule:watch_job"
        assert all(not j.args and not j.kwargs for j in jobs.values())
        second = BotScheduler(service.settings, service)
        with pytest.raises(PreflightError, match="another bot already runs the scheduler"):
            second.start(paused=True)
    finally:
        first.shutdown()
    again = BotScheduler(service.settings, service)
    again.start(paused=True)  # registering again replaces, never duplicates
    try:
        assert again.job_ids() == JOB_IDS
    finally:
        again.shutdown()
    assert service.settings.jobs_db_path.exists()
    # its own SQLite file under state/, apart from the state database
    assert service.settings.jobs_db_path != service.settings.db_path
    assert service.settings.jobs_db_path.parent == service.settings.db_path.parent


def test_a_lease_reminder_lists_only_the_runs_of_its_own_port(tmp_path: Path) -> None:
    service = make(tmp_path, lambda run: pilot_script(IDS, refuse=()), step=100)
    _lease(service)
    _lease(service, node=f"{NODE}:2222")
    on_22 = start(service, tmp_path, ssh=True, name="on22")
    on_2222 = start(service, tmp_path, ssh=True, name="on2222", port=2222)
    for run_id in (on_22, on_2222):
        service.follower.follow(run_id, timeout=30)
    sent = {m.run_id: " ".join(getattr(b, "text", "") for b in m.blocks)
            for m in check_leases(service, END - timedelta(hours=1))}
    assert sorted(sent) == sorted([on_22, on_2222])  # one reminder per lease, in its own thread
    assert on_22 in sent[on_22] and on_2222 not in sent[on_22]
    assert on_2222 in sent[on_2222] and on_22 not in sent[on_2222]


def test_one_run_failing_unexpectedly_does_not_stop_the_watch_of_the_others(
        tmp_path: Path) -> None:
    class Broken(ScriptedDispatcher):
        def read_events(self, handle: Any, offset: int) -> Any:
            if handle.run_id == broken:
                raise RuntimeError("a bug in one node's handling")
            return super().read_events(handle, offset)

    service = make(tmp_path, lambda run: pilot_script(IDS, refuse=()), step=100)
    fake = Broken(lambda run: pilot_script(IDS, refuse=()), step=100)
    service.dispatchers.update({"local": fake, "ssh": fake})  # the mapping the parts share
    broken = start(service, tmp_path, name="broken")
    healthy = start(service, tmp_path, name="healthy")
    watch_runs(service, datetime.now(timezone.utc))
    assert service.follower.ends.wait(healthy, 30)  # its end runs off the watch's thread
    assert service.store.get_run(healthy)["status"] == "awaiting_decision"
    assert service.store.get_run(broken)["status"] == "running"


def test_the_end_of_a_lease_stops_the_runs_still_using_the_node(tmp_path: Path) -> None:
    service = make(tmp_path, lambda run: pilot_script(IDS, refuse=()), step=1)
    _lease(service)
    run_id = start(service, tmp_path, ssh=True)
    other = start(service, tmp_path, name="elsewhere")  # a local run: not on the node
    fake: ScriptedDispatcher = service.dispatchers["ssh"]  # type: ignore[assignment]
    assert fake.is_alive(fake.started[0])
    [reminder] = check_leases(service, END - timedelta(minutes=30))
    assert reminder.key == "alert-lease-remind-2"
    assert fake.is_alive(fake.started[0])  # a reminder stops nothing
    [ended] = check_leases(service, END + timedelta(minutes=1))
    assert ended.key == "alert-lease-end-end"
    assert not fake.is_alive(fake.started[0])  # the runner was stopped
    assert fake.is_alive(fake.started[1])  # the local run goes on
    watch_runs(service, END + timedelta(minutes=2))
    run = service.store.get_run(run_id)
    assert run["status"] == "stopped"
    assert run["stop"]["by"] == "preflight" and "lease" in run["stop"]["reason"]
    assert service.store.get_run(other)["status"] == "running"
