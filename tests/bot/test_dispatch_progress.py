"""A start that takes minutes (a several-node volume: each node's copy, card proof and Ray)
is followed, not failed: its steps are recorded and shown, the watch judges it by its last
sign of life, and a stop ends it and what it had started.

``NodeByNode`` is a dispatcher whose start reports each node's steps through the handle,
as the SSH dispatcher does, and waits in the middle until the test lets it go on.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bot.errors import DispatchStopped
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.schedule import watch_runs
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]
NODES = ("gpu-0:22", "gpu-1:22", "gpu-2:22")


class NodeByNode(ScriptedDispatcher):
    """Copies every node, then waits for ``go_on``, then proves the cards and starts Ray on
    each. A step refused (the run was stopped) ends the start; what it had "started" is
    cleaned up, as the SSH dispatcher stops Ray on every node."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.entered, self.go_on = threading.Event(), threading.Event()
        self.cleaned: list[str] = []
        self.stopped: list[str] = []
        self.raised: list[BaseException] = []

    def start(self, handle: Any) -> int | None:
        try:
            for i, node in enumerate(NODES):
                handle.progress({"node": node, "index": i, "phase": "uploaded",
                                 "bytes": 2_000_000})
            self.entered.set()
            assert self.go_on.wait(timeout=30)
            for phase in ("proved", "ray_up"):
                for i, node in enumerate(NODES):
                    handle.progress({"node": node, "index": i, "phase": phase,
                                     "cards": [0, 1], "excluded": 0})
            handle.progress({"node": NODES[0], "index": 0, "phase": "launching"})
        except BaseException as exc:
            self.cleaned.append(handle.run_id)
            self.raised.append(exc)
            raise
        return super().start(handle)

    def stop(self, handle: Any) -> None:
        self.stopped.append(handle.run_id)
        super().stop(handle)


def make(tmp_path: Path) -> tuple[PilotService, NodeByNode, RecordingNotifier, str]:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = NodeByNode(lambda run: pilot_script(IDS, refuse=()))
    notifier = RecordingNotifier()
    service = PilotService(settings, Store(settings.db_path), {"local": dispatcher}, notifier)
    sub = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob")
    return service, dispatcher, notifier, sub.run_id


def start_in_thread(service: PilotService, run_id: str) -> tuple[threading.Thread,
                                                                 list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            service.starter.start(run_id)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_long_start_that_gives_signs_of_life_is_followed_not_failed(tmp_path: Path) -> None:
    service, dispatcher, notifier, run_id = make(tmp_path)
    thread, errors = start_in_thread(service, run_id)
    assert dispatcher.entered.wait(timeout=30)
    # The start began ten minutes ago (ten nodes, one after another): far past the grace,
    # but its last step was just now.
    long_ago = (datetime.now(timezone.utc) - timedelta(minutes=10)).isoformat()
    service.store.update_run(run_id, started_at=long_ago)
    watch_runs(service, datetime.now(timezone.utc))
    assert service.store.get_run(run_id)["status"] == "dispatching"
    shown = notifier.latest[(run_id, "dispatch")]
    assert shown.summary == "starting on 3 node(s): 3/3 copied, 0/3 proven, 0/3 Ray up"
    assert "volume.nodes[1] gpu-1:22: copy sent (2.0 MB sent)" in [
        getattr(b, "text", "") for b in shown.blocks]
    dispatcher.go_on.set()
    thread.join(timeout=30)
    assert errors == []
    assert notifier.latest[(run_id, "dispatch")].summary == (
        "starting on 3 node(s): 3/3 copied, 3/3 proven, 3/3 Ray up; launching the driver")
    steps = service.store.dispatch_events(run_id)
    assert [(e.seq, e.data["phase"]) for e in steps][:4] == [
        (1, "uploaded"), (2, "uploaded"), (3, "uploaded"), (4, "proved")]
    assert service.store.events(run_id) == []  # the runner's own events stay its own
    assert service.follower.follow(run_id, timeout=30)["outcome"] == "passed"


def test_a_start_silent_past_the_grace_is_still_settled_by_the_watch(tmp_path: Path) -> None:
    service, dispatcher, _, run_id = make(tmp_path)
    thread, errors = start_in_thread(service, run_id)
    assert dispatcher.entered.wait(timeout=30)
    later = datetime.now(timezone.utc) + timedelta(seconds=300)  # no sign for 300 s
    watch_runs(service, later)
    assert service.store.get_run(run_id)["status"] == "dispatch_failed"
    dispatcher.go_on.set()
    thread.join(timeout=30)
    # Its start went on meanwhile: the step after the watch's verdict ends it.
    assert isinstance(errors[0], DispatchStopped) and dispatcher.cleaned == [run_id]


def test_stop_while_dispatching_ends_the_start_and_what_it_started(tmp_path: Path) -> None:
    service, dispatcher, notifier, run_id = make(tmp_path)
    thread, errors = start_in_thread(service, run_id)
    assert dispatcher.entered.wait(timeout=30)
    run = service.stop(run_id, by="alice", reason="wrong corpus", wait=False)
    assert run["status"] == "stopped" and run["stop"]["by"] == "alice"
    assert dispatcher.stopped == [run_id]  # what was already up is stopped at once
    dispatcher.go_on.set()
    thread.join(timeout=30)
    assert [type(e) for e in errors] == [DispatchStopped]
    assert dispatcher.cleaned == [run_id] and not dispatcher.pending.get(run_id)  # no runner
    assert service.store.get_run(run_id)["status"] == "stopped"
    with pytest.raises(Exception, match="only a running run can be stopped, or one being started"):
        service.stop(run_id, by="alice", reason="again", wait=False)
    dispatcher.go_on.set()
    service.resume(run_id)  # and it can be started again later
    assert service.follower.follow(run_id, timeout=30)["status"] == "awaiting_decision"


def test_a_start_with_no_steps_is_kept_alive_by_its_heartbeat(tmp_path: Path) -> None:
    """A single long step (one big upload) reports nothing for minutes: the starting bot's
    heartbeat is its sign of life."""
    from bot.service.starter import DispatchHeartbeat

    service, dispatcher, _, run_id = make(tmp_path)
    service.store.transition(run_id, ("planned",), "dispatching", started_at=(
        datetime.now(timezone.utc) - timedelta(minutes=10)).isoformat())
    beat = DispatchHeartbeat(service.store, run_id, every=3600)  # what start() runs
    try:
        watch_runs(service, datetime.now(timezone.utc))
        assert service.store.get_run(run_id)["status"] == "dispatching"
    finally:
        beat.stop()
    watch_runs(service, datetime.now(timezone.utc) + timedelta(seconds=300))
    assert service.store.get_run(run_id)["status"] == "dispatch_failed"


class Quiet(NodeByNode):
    """A start that reports no step: it waits, then launches its runner."""

    def start(self, handle: Any) -> int | None:
        self.entered.set()
        assert self.go_on.wait(timeout=30)
        return ScriptedDispatcher.start(self, handle)


def test_a_runner_launched_after_its_run_was_settled_is_stopped_not_left_alone(
        tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = Quiet(lambda run: pilot_script(IDS, refuse=()))
    service = PilotService(settings, Store(settings.db_path), {"local": dispatcher},
                           RecordingNotifier())
    run_id = service.submit(load_manifest_file(write_manifest(tmp_path)),
                            submitter="bob").run_id
    thread, errors = start_in_thread(service, run_id)
    assert dispatcher.entered.wait(timeout=30)
    watch_runs(service, datetime.now(timezone.utc) + timedelta(seconds=300))
    assert service.store.get_run(run_id)["status"] == "dispatch_failed"
    dispatcher.go_on.set()
    thread.join(timeout=30)
    assert [type(e) for e in errors] == [DispatchStopped]
    assert dispatcher.stopped == [run_id]  # nobody would have followed it
    assert service.store.get_run(run_id)["status"] == "dispatch_failed"
