"""A journey validates its manifest once (issue 33): the submission validates the text and
the store's reads of the run (the follower, the thread's messages, the decision, the volume
and its balance) share that model; a bot that never saw the submission validates the
stored one once (``bot.pilot.record.stored_manifest``). Every ``Manifest`` validation is
counted (``count_validations``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.pilot.record import forget_stored_manifests, stored_manifest
from tests.bot.fakes import pilot_script
from tests.bot.manifest_helpers import count_validations
from tests.bot.test_service import IDS, make, submit

VOLUME = ('volume: {inputs: {dir: data/pilote, pattern: "doc-*.txt", expected_count: 4}, '
          'nodes: 1}')


def test_submission_to_the_volumes_balance_validates_the_manifest_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service, notifier = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    validations = count_validations(monkeypatch)
    run_id = submit(service, tmp_path, extra=VOLUME)
    assert service.follower.follow(run_id, timeout=30)["outcome"] == "passed"
    volume_id = service.decider.decide(run_id, "approve", "pilot clean", "alice")["volume_run"]
    assert service.follower.follow(volume_id, timeout=30)["outcome"] == "passed"
    service.records.show(volume_id)
    assert validations == ["model_validate"], validations  # the manifest file, loaded
    # the pilot's and its volume's are the same manifest: one model, shared
    assert service.records.record(run_id).manifest is service.records.record(volume_id).manifest


def test_a_bot_that_never_saw_the_submission_validates_the_stored_manifest_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service, notifier = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    run_id = submit(service, tmp_path, extra=VOLUME)
    assert service.follower.follow(run_id, timeout=30)["outcome"] == "passed"
    validations = count_validations(monkeypatch)
    volume_id = service.decider.decide(run_id, "approve", "pilot clean", "alice")["volume_run"]
    assert service.follower.follow(volume_id, timeout=30)["outcome"] == "passed"
    service.records.show(run_id)
    assert validations == ["model_validate_json"], validations  # the stored manifest


def test_a_stored_manifest_that_no_longer_validates_says_why() -> None:
    forget_stored_manifests()
    manifest, problem = stored_manifest('{"apiVersion": "preflight/v1", "name": "x"}')
    assert manifest is None and problem is not None
    assert problem.startswith("no longer validates (")
