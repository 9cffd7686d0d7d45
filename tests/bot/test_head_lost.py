"""A volume whose head node is out of reach for good: the follower gives up and the
volume's other nodes are stopped (their Ray and cards are not left to a driver that is
gone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.errors import ContactLost, NodeUnreachable
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script
from tests.bot.test_service import submit

IDS = [f"doc-{n:02d}" for n in range(1, 5)]


class HeadGone(ScriptedDispatcher):
    """The runner's node answers nothing once the run started; the other nodes answer."""

    def __init__(self) -> None:
        super().__init__(lambda run: pilot_script(IDS, refuse=()))
        self.stopped_others: list[str] = []

    def read_events(self, handle: RunHandle, offset: int) -> Any:
        raise NodeUnreachable("gpu-a:22: connection timed out")

    def clean_up(self, handle: RunHandle) -> list[str]:
        self.stopped_others.append(handle.run_id)
        return ["volume.nodes[0] gpu-a:22: unreachable"]  # the head: tried again later


def test_a_follower_that_gives_up_on_the_head_stops_the_other_nodes(tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path),
                                  "PREFLIGHT_SSH_GIVE_UP_S": "0.05"})
    dispatcher = HeadGone()
    service = PilotService(settings, Store(settings.db_path), {"local": dispatcher},
                           RecordingNotifier())
    run_id = submit(service, tmp_path)
    with pytest.raises(ContactLost):
        service.follower.follow(run_id, timeout=30)
    assert dispatcher.stopped_others == [run_id]


class CleanedUp(ScriptedDispatcher):
    """Records the runs cleaned up: a runner found dead has its start's Ray stopped once,
    by the follower, never by a look at whether it lives."""

    def __init__(self) -> None:
        super().__init__(lambda run: pilot_script(IDS, refuse=(), finish=False))
        self.released: list[str] = []

    def clean_up(self, handle: RunHandle) -> list[str]:
        self.released.append(handle.run_id)
        return []


def test_a_runner_found_dead_is_cleaned_up_by_the_follower(tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = CleanedUp()
    service = PilotService(settings, Store(settings.db_path), {"local": dispatcher},
                           RecordingNotifier())
    run_id = submit(service, tmp_path)
    run = service.follower.follow(run_id, timeout=30)
    assert run["outcome"] == "failed"  # died: no run.finished
    assert dispatcher.released == [run_id]


def test_a_start_interrupted_before_its_runner_is_cleaned_up_when_settled(
        tmp_path: Path) -> None:
    """A bot that died mid-start may have left a volume's Ray up: the watch that settles
    the run as dispatch_failed cleans up what the start brought up (issue 33)."""
    from datetime import datetime, timedelta, timezone

    from bot.manifest.load import load_manifest_file
    from bot.pilot.clock import now_utc
    from tests.bot.fakes import write_manifest

    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = CleanedUp()
    service = PilotService(settings, Store(settings.db_path), {"local": dispatcher},
                           RecordingNotifier())
    crashed = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob")
    service.store.transition(crashed.run_id, ("planned",), "dispatching", started_at=now_utc())
    assert service.follower.reap(crashed.run_id, now=datetime.now(timezone.utc)) is False
    assert dispatcher.released == []  # within the grace: maybe still being started
    service.follower.reap(crashed.run_id, now=datetime.now(timezone.utc) + timedelta(seconds=300))
    assert service.store.get_run(crashed.run_id)["status"] == "dispatch_failed"
    assert dispatcher.released == [crashed.run_id]
