"""A journey parses the run's payloads once per step (issue 33): every ``Balance``,
``Evidence`` and ``StoredForecast`` parse (bot/pilot/payloads.py) is counted while a Slack
message becomes a verdict, on the local kind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.pilot.payloads import Balance, Evidence, StoredForecast
from tests.slack.conftest import APPROVER, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project
from tests.slack.test_decisions import finished_pilot


def count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    for cls in (Balance, Evidence, StoredForecast):
        entry: Callable[..., Any] = cls.from_stored.__func__  # type: ignore[attr-defined]

        def counted(klass: type, run: str, value: object, _entry: Any = entry) -> Any:
            calls.append(f"{klass.__name__} {run}")
            return _entry(klass, run, value)

        monkeypatch.setattr(cls, "from_stored", classmethod(counted))
    return calls


def test_a_slack_message_to_its_verdict_parses_each_payload_once_a_step(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    parses = count_parses(monkeypatch)
    h: Harness = make_harness(ReplayDispatcher(refused=()))
    _, run = finished_pilot(h, emulator, make_project(tmp_path, volume=6, refused=()))
    assert run["outcome"] == "passed", run["verdict"]
    ran = run["id"]
    # its end: the balance and evidence recorded, typed for the verdict; its outcome: the
    # run read once (its forecast now stored too) for the report and the whole thread
    assert parses == [f"Balance {ran}", f"Evidence {ran}",
                      f"Balance {ran}", f"Evidence {ran}", f"StoredForecast {ran}"], parses



def test_an_approval_to_its_volumes_balance_reads_the_pilot_once_a_step(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    h: Harness = make_harness(ReplayDispatcher(refused=()))
    ts, run = finished_pilot(h, emulator, make_project(tmp_path, volume=6, refused=()))
    parses = count_parses(monkeypatch)
    h.decide_via_modal(run["id"], "approve", "pilot passed", user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: h.store.volume_of(run["id"]) is not None)
    volume = h.settle(str(h.store.volume_of(run["id"])))
    assert volume["outcome"] == "passed" and volume["balance"]["recheck"]["ok"]
    # the pilot: the decision (the run decided on, then as decided: its message, its
    # report, the volume it launched), the volume's end (its forecast checked against the
    # pilot's) and the volume's report (the pilot's forecast beside the actual); each read
    # parses its three payloads once (was 9 reads before issue 33's point 5)
    pilot = [p for p in parses if p.endswith(f" {run['id']}")]
    assert pilot == [f"{kind} {run['id']}" for kind in ("Balance", "Evidence",
                                                         "StoredForecast")] * 4, parses
    # the volume: its end (typed for its verdict), its outcome (one read)
    assert parses.count(f"Balance {volume['id']}") == 2, parses
