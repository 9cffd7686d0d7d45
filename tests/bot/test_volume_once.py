"""One approval of a pilot launches at most one volume, whatever the path."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bot.errors import DecisionRefused, PreflightError, VolumeExists
from bot.manifest.load import load_manifest
from bot.messages.model import Actions, Heading
from bot.service import PilotService
from bot.service.handles import base_dir_of
from bot.store import Store
from tests.bot.fakes import pilot_script
from tests.bot.test_service import IDS, make, submit

VOLUME = ('volume: {inputs: {dir: data/pilote, pattern: "doc-*.txt", expected_count: 4}, '
          'nodes: 1}')


def approved(tmp_path: Path, approvers: str = "[alice]") -> tuple[PilotService, str, str]:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    pilot = submit(service, tmp_path, extra=VOLUME, approvers=approvers)
    service.follower.follow(pilot, timeout=30)
    volume = service.decider.decide(pilot, "approve", "pilot clean", "alice")["volume_run"]
    assert volume is not None
    return service, pilot, volume


def test_a_finished_volume_has_no_scale_up_decision(tmp_path: Path) -> None:
    service, pilot, volume = approved(tmp_path)
    run = service.follower.follow(volume, timeout=30)
    assert (run["status"], run["outcome"]) == ("finished", "passed")
    with pytest.raises(DecisionRefused, match="volume run of pilot .* no scale-up decision"):
        service.decider.decide(volume, "approve", "again", "alice")
    assert [r["kind"] for r in service.records.runs()].count("volume") == 1  # no -v2
    messages = {m.key: m for m in service.publisher.thread_messages(volume)}
    status_title = messages["status"].blocks[0]
    assert isinstance(status_title, Heading) and status_title.text.startswith("Volume run")
    decision = messages["decision"]
    assert not any(isinstance(b, Actions) for b in decision.blocks)  # no buttons to press
    assert "Nothing to decide" in " ".join(getattr(b, "text", "") for b in decision.blocks)


def test_a_second_approval_names_the_volume_already_launched(tmp_path: Path) -> None:
    service, pilot, volume = approved(tmp_path, approvers="[alice, carol]")
    with pytest.raises(DecisionRefused, match=f"already launched the volume run {volume}"):
        service.decider.decide(pilot, "approve", "me too", "carol")
    assert service.records.show(pilot)["volume_run"] == volume


def test_two_approvers_at_once_launch_one_volume(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    pilot = submit(service, tmp_path, extra=VOLUME, approvers="[alice, carol]")
    service.follower.follow(pilot, timeout=30)
    # Two bots (two services on the same database), two people, the same instant.
    other = PilotService(service.settings, Store(service.settings.db_path),
                         service.dispatchers, service.publisher.notifier)
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def approve(svc: PilotService, who: str) -> None:
        barrier.wait(timeout=10)
        try:
            results[who] = svc.decider.decide(pilot, "approve", "clean", who)["volume_run"]
        except PreflightError as exc:
            results[who] = exc

    threads = [threading.Thread(target=approve, args=(s, w))
               for s, w in ((service, "alice"), (other, "carol"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    launched = [v for v in results.values() if isinstance(v, str)]
    refused = [v for v in results.values() if isinstance(v, DecisionRefused)]
    assert len(launched) == 1 and len(refused) == 1, results
    assert "already decided" in str(refused[0])
    assert [r["id"] for r in service.records.runs() if r["kind"] == "volume"] == launched


def test_the_store_refuses_a_second_volume_of_one_pilot(tmp_path: Path) -> None:
    service, pilot, volume = approved(tmp_path)
    row = service.store.get_run(volume)
    again = {**row, "id": row["id"] + "-again", "attempt": 99, "run_dir": str(tmp_path / "x")}
    with pytest.raises(VolumeExists, match=f"already launched the volume run {volume}"):
        service.store.create_run(again)
    # The service path too (a retried launch): refused, and no run directory left behind.
    before = {p.name for p in Path(row["run_dir"]).parent.iterdir()}
    run = service.store.run(pilot)
    loaded = load_manifest(run.manifest_text or "", source=pilot, base_dir=base_dir_of(run))
    with pytest.raises(VolumeExists):
        service._launch_volume(run, loaded)
    assert {p.name for p in Path(row["run_dir"]).parent.iterdir()} == before


def test_refused_decisions_are_shown_in_the_thread(tmp_path: Path) -> None:
    from bot.console.render import to_text

    service, pilot, _ = approved(tmp_path, approvers="[alice, carol]")
    with pytest.raises(DecisionRefused):
        service.decider.decide(pilot, "revise", "too late", "carol")
    text = to_text({m.key: m for m in service.publisher.thread_messages(pilot)}["decision"])
    assert "1 refused attempt(s):" in text and "carol" in text
    assert "already decided" in text
