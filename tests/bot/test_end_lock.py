"""Two bot processes end one run: one stops it and fetches its results, the other waits
for it, says whom it waits for, and finds the run ended (issue 37, point 3). Each
"process" is a service of its own over the same state database, as two `preflight`
commands are; the fetch is a fake that waits until the test lets it go."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.service.end_lock import LOCK_FILE
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest
from tests.processes import wait_until

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]


class Fetches:
    """What both processes' fetches share: how many ran, how many at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = self.now = self.most = 0
        self.entered = threading.Event()
        self.go_on = threading.Event()


class SlowFetch(ScriptedDispatcher):
    def __init__(self, fetches: Fetches, script: Any) -> None:
        super().__init__(script)
        self.fetches = fetches

    def fetch_results(self, handle: RunHandle) -> None:
        f = self.fetches
        with f.lock:
            f.calls += 1
            f.now += 1
            f.most = max(f.most, f.now)
        f.entered.set()
        assert f.go_on.wait(timeout=30)
        with f.lock:
            f.now -= 1


def service_of(home: Path, fetches: Fetches) -> PilotService:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(home)})
    return PilotService(settings, Store(settings.db_path),
                        {"local": SlowFetch(fetches, lambda run: pilot_script(IDS, refuse=()))},
                        RecordingNotifier())


def test_two_processes_ending_one_run_fetch_once(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    fetches = Fetches()
    first, second = service_of(tmp_path, fetches), service_of(tmp_path, fetches)
    run_id = first.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob").run_id
    first.starter.start(run_id)
    results: dict[str, Any] = {}

    def follow(name: str, service: PilotService) -> None:
        try:
            results[name] = service.follower.follow(run_id, timeout=60)
        except Exception as exc:  # noqa: BLE001 - told by the assertion below
            results[name] = exc

    one = threading.Thread(target=follow, args=("first", first))
    one.start()
    assert fetches.entered.wait(timeout=30)  # the first is fetching, holding the lock
    run_dir = Path(first.store.get_run(run_id)["run_dir"])
    assert '"doing": "fetching its results"' in (run_dir / LOCK_FILE).read_text()
    caplog.set_level(logging.WARNING)
    two = threading.Thread(target=follow, args=("second", second))
    two.start()
    wait_until(lambda: "another bot process is ending it" in caplog.text,
               "the second process to say whom it waits for", 30)
    assert "fetching its results since" in caplog.text and fetches.calls == 1
    fetches.go_on.set()
    one.join(timeout=30)
    two.join(timeout=30)
    assert (fetches.calls, fetches.most) == (1, 1)
    for name in ("first", "second"):
        assert isinstance(results[name], dict), results[name]
        assert (results[name]["status"], results[name]["outcome"]) == ("awaiting_decision",
                                                                     "passed")
    assert (run_dir / LOCK_FILE).read_text() == ""  # held by nobody
    for service in (first, second):
        service.close()
        service.store.close()
