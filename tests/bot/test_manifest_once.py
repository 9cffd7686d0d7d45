"""A journey validates its stored manifest once (issue 33): the store's reads of a run
(the follower, the thread's messages, the decision, the volume and its balance) share one
validated ``Manifest`` per stored text (``bot.pilot.record.stored_manifest``)."""

from __future__ import annotations

from pathlib import Path

from bot.pilot.record import stored_manifest
from tests.bot.fakes import pilot_script
from tests.bot.test_service import IDS, make, submit

VOLUME = ('volume: {inputs: {dir: data/pilote, pattern: "doc-*.txt", expected_count: 4}, '
          'nodes: 1}')


def test_approval_to_the_volumes_balance_validates_the_stored_manifest_once(
        tmp_path: Path) -> None:
    service, notifier = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    stored_manifest.cache_clear()
    run_id = submit(service, tmp_path, extra=VOLUME)
    assert service.follow(run_id, timeout=30)["outcome"] == "passed"
    volume_id = service.decide(run_id, "approve", "pilot clean", "alice")["volume_run"]
    assert service.follow(volume_id, timeout=30)["outcome"] == "passed"
    service.show(volume_id)
    reads = stored_manifest.cache_info()
    assert reads.misses == 1, reads  # the pilot's and its volume's are the same manifest
    assert reads.hits >= 10, reads  # read many times: each read shared that one check
    assert service.records.record(run_id).manifest is service.records.record(volume_id).manifest


def test_a_stored_manifest_that_no_longer_validates_says_why() -> None:
    manifest, problem = stored_manifest('{"apiVersion": "preflight/v1", "name": "x"}')
    assert manifest is None and problem is not None
    assert problem.startswith("no longer validates (")
