"""No mistake strands a pilot: what an approval's volume needs is checked before the
approval is recorded, and a volume that cannot be created leaves the pilot approvable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.errors import DecisionRefused, DispatchError, LeaseError, StoreError
from bot.manifest.load import load_manifest_file
from bot.messages.model import Actions, RecordingNotifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Run, Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]
VOLUME = 'volume: {inputs: {dir: corpus, pattern: "doc-*.txt", expected_count: 3}}'


class FullStore(Store):
    """A store whose disk is full when the volume's row is written (every other write works)."""

    def create_run(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "volume":
            raise StoreError("database or disk is full")
        super().create_run(record)


def _corpus(root: Path, count: int = 3) -> Path:
    corpus = root / "corpus"
    corpus.mkdir(exist_ok=True)
    for n in range(1, count + 1):
        (corpus / f"doc-{n:02d}.txt").write_text(f"contract {n}", encoding="utf-8")
    return corpus


def _passed_pilot(tmp_path: Path, store: type[Store] = Store,
                  **kw: Any) -> tuple[PilotService, str]:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    service = PilotService(settings, store(settings.db_path),
                           {"local": ScriptedDispatcher(lambda run: pilot_script(
                               IDS if run.endswith("a1") else ["doc-01", "doc-02", "doc-03"],
                               refuse=()))}, RecordingNotifier(), **kw)
    _corpus(tmp_path)
    sub = service.submit(load_manifest_file(write_manifest(tmp_path, extra=VOLUME)),
                         submitter="bob")
    service.starter.start(sub.run_id)
    assert service.follower.follow(sub.run_id, timeout=30)["outcome"] == "passed"
    return service, sub.run_id


def _buttons(service: PilotService, run_id: str) -> list[str]:
    decision = [m for m in service.publisher.thread_messages(run_id) if m.key == "decision"][-1]
    return [b.action for block in decision.blocks if isinstance(block, Actions)
            for b in block.buttons]


def test_a_volume_folder_gone_refuses_the_approval_before_it_is_recorded(tmp_path: Path) -> None:
    service, pilot = _passed_pilot(tmp_path)
    (tmp_path / "corpus").rename(tmp_path / "corpsu")
    with pytest.raises(DecisionRefused, match=r"volume\.inputs\.dir") as caught:
        service.decider.decide(pilot, "approve", "pilot clean", "alice")
    assert "corpus is not a directory" in str(caught.value)
    run = service.store.get_run(pilot)
    assert run["status"] == "awaiting_decision" and service.store.volume_of(pilot) is None
    [refused] = service.store.decisions(pilot)
    assert refused["accepted"] == 0 and "volume.inputs.dir" in refused["refusal"]
    assert _buttons(service, pilot) == ["approve", "fix-env", "revise"]
    (tmp_path / "corpsu").rename(tmp_path / "corpus")  # fixed: the same pilot is approved
    record = service.decider.decide(pilot, "approve", "pilot clean", "alice")
    assert record["volume_run"] == service.store.volume_of(pilot)


def test_a_volume_count_changed_since_the_pilot_refuses_the_approval(tmp_path: Path) -> None:
    service, pilot = _passed_pilot(tmp_path)
    (tmp_path / "corpus" / "doc-03.txt").unlink()
    with pytest.raises(DecisionRefused, match=r"volume\.inputs\.expected_count.*found 2"):
        service.decider.decide(pilot, "approve", "pilot clean", "alice")
    assert service.store.get_run(pilot)["status"] == "awaiting_decision"


def test_a_volume_row_that_cannot_be_written_leaves_the_pilot_approvable(tmp_path: Path) -> None:
    service, pilot = _passed_pilot(tmp_path, FullStore)
    with pytest.raises(DecisionRefused, match="database or disk is full") as caught:
        service.decider.decide(pilot, "approve", "pilot clean", "alice")
    message = str(caught.value)
    assert "not recorded" in message and "awaits its decision again" in message
    run = service.store.get_run(pilot)
    assert run["status"] == "awaiting_decision" and service.store.volume_of(pilot) is None
    [undone] = service.store.decisions(pilot)
    assert undone["accepted"] == 0 and "the volume run was not created" in undone["refusal"]
    # `show` tells the truth: no "Scale-up approved", the buttons again, the reason listed.
    texts = " ".join(str(b) for m in service.publisher.thread_messages(pilot) for b in m.blocks)
    assert "Scale-up approved" not in texts and "database or disk is full" in texts
    assert _buttons(service, pilot) == ["approve", "fix-env", "revise"]
    assert service.decider.decision_refusal(pilot) is None


def test_a_volume_node_without_a_lease_refuses_the_approval_before_it_is_recorded(
        tmp_path: Path) -> None:
    def lease_guard(run: Run) -> None:
        if run.kind == "volume":
            raise LeaseError("node gpu-b.example: no lease recorded")

    service, pilot = _passed_pilot(tmp_path, lease_guard=lease_guard)
    with pytest.raises(DecisionRefused, match="no lease recorded"):
        service.decider.decide(pilot, "approve", "pilot clean", "alice")
    assert service.store.get_run(pilot)["status"] == "awaiting_decision"
    assert service.store.volume_of(pilot) is None


class RefusingStart(ScriptedDispatcher):
    """A node that refuses the volume's runner (unreachable, full disk...)."""

    def start(self, handle: Any) -> int | None:
        if handle.run_id.endswith("-v1"):
            raise DispatchError("node gpu-b.example: connection refused")
        return super().start(handle)


def test_a_volume_created_but_not_started_keeps_the_approval_and_says_resume(
        tmp_path: Path) -> None:
    service, pilot = _passed_pilot(tmp_path)
    service.dispatchers["local"] = RefusingStart(service.dispatchers["local"].script)
    with pytest.raises(DispatchError, match="connection refused") as caught:
        service.decider.decide(pilot, "approve", "pilot clean", "alice")
    volume = service.store.volume_of(pilot)
    assert volume is not None and f"preflight resume {volume}" in str(caught.value)
    assert service.store.get_run(pilot)["status"] == "decided"
    assert service.store.get_run(volume)["status"] == "dispatch_failed"


def test_approving_a_pilot_without_a_volume_says_nothing_was_launched_and_why(
        tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    service = PilotService(settings, Store(settings.db_path), {"local": ScriptedDispatcher(
        lambda run: pilot_script(IDS, refuse=()))}, RecordingNotifier())
    sub = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob")
    service.starter.start(sub.run_id)
    service.follower.follow(sub.run_id, timeout=30)
    assert service.decider.decide(sub.run_id, "approve", "clean", "alice")["volume_run"] is None
    decision = [m for m in service.publisher.thread_messages(sub.run_id) if m.key == "decision"][-1]
    text = " ".join(str(b) for b in decision.blocks)
    assert "nothing launched: the manifest has no volume section" in text
