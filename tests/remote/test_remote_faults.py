"""Fault tests with a real sshd: dropped connection, bot restart, stalled runner, recovery."""

from __future__ import annotations

import json
import os
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bot.schedule import BotScheduler, watch_runs
from bot.service.handles import handle_for
from tests.remote.remote_kit import (
    assert_exactly_once,
    items_done,
    make_bot,
    provision,
    provisioned_bot,
    pump_until,
    start_run,
    submit,
    wait_for,
    write_project,
)
from tests.remote.sshd_server import Sshd

JOB_IDS = ["preflight-evidence", "preflight-leases", "preflight-retention", "preflight-watch"]


def test_connection_killed_mid_run_runner_continues_and_bot_reconnects(tmp_path: Path,
                                                                       sshd: Sshd) -> None:
    workdir = tmp_path / "node"

    manifest = write_project(tmp_path / "project", sshd.node(workdir), count=6, gate_after=2)
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = start_run(bot, manifest)
        pump_until(bot, run_id, items_done(2))
        connects = bot.dispatcher.connects
        assert sshd.kill_connections() >= 1
        remote_run = workdir / "runs" / run_id
        (remote_run / "go").write_text("")  # the runner may go on; the bot is disconnected
        run = bot.service.follower.follow(run_id, timeout=60)
        assert run["outcome"] == "passed", run["verdict"]
        assert bot.dispatcher.connects > connects  # it reconnected
        assert_exactly_once(bot, run_id, remote_run)
        assert (remote_run / "exit_code").read_text().strip() == "0"
        published_items = [m for m in bot.notifier.history if m.key == "balance"]
        assert len(published_items) == 1


def test_bot_restarted_mid_run_restores_jobs_and_resumes_from_the_stored_offset(
        tmp_path: Path, sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir), count=5, gate_after=3)
    first = make_bot(tmp_path / "home", sshd.dispatcher())
    scheduler = BotScheduler(first.settings, first.service)
    scheduler.start(paused=True)
    try:
        provision(first.store, sshd.lease_key)
        run_id = submit(first, manifest)
        first.service.starter.start(run_id)
        pump_until(first, run_id, items_done(3))
        seen = first.store.get_run(run_id)
        assert scheduler.job_ids() == JOB_IDS
    finally:
        scheduler.shutdown()
        first.close()  # the "bot process" ends: connections closed, nothing stops the runner

    second = make_bot(tmp_path / "home", sshd.dispatcher())
    restored = BotScheduler(second.settings, second.service)
    restored.start(paused=True, register=False)  # nothing added: only what the store kept
    try:
        assert restored.job_ids() == JOB_IDS
        run = second.store.get_run(run_id)
        assert (run["last_seq"], run["events_offset"]) == (seen["last_seq"], seen["events_offset"])
        handle = handle_for(second.store.run_record(run_id))
        assert second.dispatcher.is_alive(handle)
        (workdir / "runs" / run_id / "go").write_text("")

        events_file = workdir / "runs" / run_id / "events.jsonl"

        seen_last: dict[str, Any] = {}  # what the last look saw, named if the wait fails

        def finished() -> bool:  # the verdict in, and the runner's file read to its end
            watch_runs(second.service, datetime.now(timezone.utc))
            run = second.store.get_run(run_id)
            seen_last.update(status=run["status"], finished_at=run["finished_at"],
                             events_offset=run["events_offset"],
                             file_size=events_file.stat().st_size,
                             ending=second.service.follower.ends.busy(run_id))
            return (run["status"] == "awaiting_decision" and run["finished_at"] is not None
                    and run["events_offset"] == events_file.stat().st_size)

        try:
            wait_for(finished, timeout=60, what="the watch to consume the rest of the run")
        except AssertionError as exc:  # an intermittent failure under load: say where it was
            raise AssertionError(f"{exc}; last seen: {seen_last}") from exc
        assert_exactly_once(second, run_id, workdir / "runs" / run_id)
        # the new process posted only what it consumed itself: no stage posted twice
        new_items = [e for e in second.store.events(run_id, after_seq=seen["last_seq"])
                     if e.type == "item.done"]
        assert [e.data["id"] for e in new_items] == ["doc-04", "doc-05"]
        assert second.store.get_run(run_id)["outcome"] == "passed"
    finally:
        restored.shutdown()
        second.close()


def test_stalled_runner_alerts_once_and_its_return_is_announced_once(tmp_path: Path,
                                                                     sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    node = sshd.node(workdir, stall_after_s=120)
    manifest = write_project(tmp_path / "project", node, count=4, gate_after=2)
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = start_run(bot, manifest)
        pump_until(bot, run_id, items_done(2))
        remote_run = workdir / "runs" / run_id
        layout = Path(bot.store.get_run(run_id)["run_dir"]) / "remote.json"
        pid = json.loads(layout.read_text())["pid"]
        os.killpg(pid, signal.SIGSTOP)
        try:
            t0 = datetime.now(timezone.utc)
            assert watch_runs(bot.service, t0) == []
            assert watch_runs(bot.service, t0 + timedelta(seconds=60)) == []
            alerts = watch_runs(bot.service, t0 + timedelta(seconds=121))
            assert [m.key for m in alerts] == ["alert-stall"]
            text = alerts[0].summary
            assert "Last stage: pilot" in text and "last event at 20" in text
            assert watch_runs(bot.service, t0 + timedelta(seconds=400)) == []  # once only
            (remote_run / "go").write_text("")
        finally:
            os.killpg(pid, signal.SIGCONT)
        pump_until(bot, run_id, lambda events: events[-1].type == "run.finished")
        back = watch_runs(bot.service, t0 + timedelta(seconds=500))
        assert [m.key for m in back] == ["alert-recovered"]
        assert watch_runs(bot.service, t0 + timedelta(seconds=900)) == []
        assert [m.key for m in bot.notifier.history].count("alert-stall") == 1
