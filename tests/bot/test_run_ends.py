"""A run's end (its results fetched, then judged) runs off the follower's thread
(bot/service/run_ends.py): while a slow fetch goes on, the follower reads on, the watch
does not take the silent runner for dead, and ``follow`` returns the verdict once the
fetch is over."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from bot.dispatch.base import RunHandle
from bot.service import PilotService
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script
from tests.bot.test_service import IDS, make, submit


class SlowFetch(ScriptedDispatcher):
    """Its fetch waits until the test lets it go."""

    def __init__(self, script: Any) -> None:
        super().__init__(script)
        self.fetching = threading.Event()
        self.go = threading.Event()
        self.fetcher: list[str] = []

    def fetch_results(self, handle: RunHandle) -> None:
        self.fetcher.append(threading.current_thread().name)
        self.fetching.set()
        assert self.go.wait(30), "the test never let the fetch go"


def test_a_slow_fetch_holds_neither_the_follower_nor_the_watch(tmp_path: Path) -> None:
    service, notifier = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    slow = SlowFetch(lambda run: pilot_script(IDS, refuse=()))
    service = PilotService(service.settings, Store(service.settings.db_path),
                           {"local": slow}, notifier)
    run_id = submit(service, tmp_path)
    service.follower.pump(run_id)  # run.finished read: its end starts, and pump returns
    assert slow.fetching.wait(30)
    assert slow.fetcher[0].startswith("run-end") and slow.fetcher[0] != \
        threading.current_thread().name
    assert service.store.run_record(run_id).status == "running"
    # the watch's look: the runner has exited, but its end is under way: not a death
    assert not service.follower.reap(run_id)
    assert service.store.run_record(run_id).status == "running"
    assert service.follower.pump(run_id) == []  # the follower reads on; no second end started
    slow.go.set()
    run = service.follower.follow(run_id, timeout=30)
    assert run["outcome"] == "passed" and run["status"] == "awaiting_decision"
    assert len(slow.fetcher) == 1
    assert "verdict" in [m.key for m in notifier.history]
