"""A journey validates the manifest once (issue 33): every ``Manifest`` validation (its two
entry points, ``model_validate`` and ``model_validate_json``) is counted while a Slack
message becomes a verdict, and while an approval becomes its volume's balance, on the
local kind. The submission validates the text; every later read of the run shares that
model; an approval in a bot that never saw the pilot validates the stored one once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.pilot.record import forget_stored_manifests
from tests.bot.manifest_helpers import count_validations
from tests.slack.conftest import APPROVER, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project
from tests.slack.test_decisions import finished_pilot


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The ``Manifest`` validations made from now on, by entry point."""
    yield count_validations(monkeypatch)
    forget_stored_manifests()


def test_a_slack_message_to_its_verdict_validates_the_manifest_once(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any,
        validations: list[str]) -> None:
    h: Harness = make_harness(ReplayDispatcher(refused=()))
    _, run = finished_pilot(h, emulator, make_project(tmp_path, volume=6, refused=()))
    assert run["outcome"] == "passed", run["verdict"]
    assert h.store.message_ref(run["id"], "verdict", "slack")
    assert validations == ["model_validate"], validations  # the text, as submitted


def test_an_approval_to_its_volumes_balance_validates_the_manifest_once(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any,
        validations: list[str]) -> None:
    h: Harness = make_harness(ReplayDispatcher(refused=()))
    ts, run = finished_pilot(h, emulator, make_project(tmp_path, volume=6, refused=()))
    forget_stored_manifests()  # as a bot started after the pilot: nothing validated yet
    validations.clear()
    h.decide_via_modal(run["id"], "approve", "pilot passed", user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: h.store.volume_of(run["id"]) is not None)
    volume = h.settle(str(h.store.volume_of(run["id"])))
    assert volume["outcome"] == "passed" and volume["balance"]["recheck"]["ok"]
    assert h.store.message_ref(volume["id"], "balance", "slack")
    assert len(validations) == 1, validations
