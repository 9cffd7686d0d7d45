"""The run's own fetch caps (sized from its pilot, bot/pilot/fetch_caps.py) hold at its
end; an explicit `preflight fetch RUN` asks the dispatcher for the bot host's ceiling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.dispatch.base import RunHandle
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script
from tests.bot.test_service import IDS, submit


class Asked(ScriptedDispatcher):
    """Remembers, for each fetch, whether it was asked for the ceiling."""

    def __init__(self, script: Any) -> None:
        super().__init__(script)
        self.ceilings: list[bool] = []

    def fetch_results(self, handle: RunHandle) -> None:
        self.ceilings.append(handle.ceiling)


def test_the_run_end_fetch_keeps_the_sized_caps_and_a_fetch_asked_for_uses_the_ceiling(
        tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = Asked(lambda run: pilot_script(IDS, refuse=()))
    service = PilotService(settings, Store(settings.db_path), {"local": dispatcher},
                           RecordingNotifier())
    run_id = submit(service, tmp_path)
    assert service.follower.follow(run_id, timeout=30)["outcome"] == "passed"
    assert dispatcher.ceilings == [False]
    service.fetch(run_id)
    assert dispatcher.ceilings == [False, True]
