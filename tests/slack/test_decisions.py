"""Decisions from the thread: buttons and modals, typed commands, the approval rules."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bot.store import Store
from tests.slack.conftest import APPROVER, CHANNEL, SUBMITTER, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project


def finished_pilot(h: Harness, emulator: SlackEmulator, text: str,
                   user: str = SUBMITTER) -> tuple[str, dict[str, Any]]:
    ts, _ = h.mention(f"```{text}```", user=user)
    emulator.wait_for(lambda: h.store.list_runs())
    return ts, h.settle(str(h.store.list_runs()[0]["id"]))


def refusals(h: Harness, run_id: str) -> list[dict[str, Any]]:
    return [d for d in h.store.decisions(run_id) if not d["accepted"]]


def test_button_opens_a_reason_modal_and_a_second_click_does_nothing(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    ts, run = finished_pilot(h, emulator, make_project(tmp_path))
    status, _ = h.click("revise", run["id"], user=SUBMITTER, thread_ts=ts)
    assert status == 200
    emulator.wait_for(lambda: emulator.views)
    view = next(iter(emulator.views.values()))
    assert view["callback_id"] == "preflight_decide"
    status, body = h.decide_via_modal(run["id"], "revise", "   ", user=SUBMITTER, thread_ts=ts)
    assert status == 200 and '"response_action": "errors"' in body.replace('":"', '": "')
    assert h.store.get_run(run["id"])["status"] == "awaiting_decision"
    h.decide_via_modal(run["id"], "revise", "batch size too big", user=SUBMITTER, thread_ts=ts)
    h.wait_status(run["id"], ("decided",))
    h.click("approve", run["id"], user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: emulator.ephemerals)
    assert "already decided" in emulator.ephemerals[-1]["text"]
    assert len(emulator.views) == 1  # no second modal
    accepted = [d for d in h.store.decisions(run["id"]) if d["accepted"]]
    assert [(d["decision"], d["by"], d["source"]) for d in accepted] == [
        ("revise", SUBMITTER, "slack")]


def test_non_approver_is_refused_ephemerally_and_recorded(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    ts, run = finished_pilot(h, emulator, make_project(tmp_path))
    h.mention("approve looks fine to me", user="U0STRANGER", thread_ts=ts)
    emulator.wait_for(lambda: refusals(h, run["id"]))
    assert "not an approver" in refusals(h, run["id"])[0]["refusal"]
    emulator.wait_for(lambda: emulator.ephemerals)
    note = emulator.ephemerals[-1]
    assert note["user"] == "U0STRANGER" and "refused" in note["text"]
    assert h.store.get_run(run["id"])["status"] == "awaiting_decision"


def test_two_person_rule_refuses_the_submitter_then_an_approver_approves(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path, two_person=True, approvers=(SUBMITTER, APPROVER))
    h: Harness = make_harness(ReplayDispatcher())
    ts, run = finished_pilot(h, emulator, text, user=SUBMITTER)
    h.decide_via_modal(run["id"], "approve", "my own pilot", user=SUBMITTER, thread_ts=ts)
    emulator.wait_for(lambda: refusals(h, run["id"]))
    assert "two-person" in refusals(h, run["id"])[0]["refusal"]
    h.mention("approve balance and sample reviewed", user=APPROVER, thread_ts=ts)
    run = h.decided(run["id"])
    decided = [d for d in h.store.decisions(run["id"]) if d["accepted"]]
    assert [(d["decision"], d["by"], d["reason"]) for d in decided] == [
        ("approve", APPROVER, "balance and sample reviewed")]
    ref = h.store.message_ref(run["id"], "decision", "slack")["ref"]
    assert "Scale-up approved" in emulator.messages[(CHANNEL, ref)].text


def test_failed_pilot_needs_override_and_it_is_recorded(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher(fail_stage="compute"))
    ts, run = finished_pilot(h, emulator, make_project(tmp_path))
    assert run["outcome"] == "failed"
    ref = h.store.message_ref(run["id"], "first_error", "slack")
    first_error = emulator.messages[(CHANNEL, ref["ref"])]
    assert "compute" in str(first_error.blocks) and "torch build" in str(first_error.blocks)
    h.mention("approve ship it", user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: refusals(h, run["id"]))
    assert "override" in refusals(h, run["id"])[0]["refusal"]
    h.mention("approve override: the GPU is replaced tomorrow", user=APPROVER, thread_ts=ts)
    h.wait_status(run["id"], ("decided",))
    decided = [d for d in h.store.decisions(run["id"]) if d["accepted"]]
    assert decided[0]["override"] == 1


def test_approval_with_volume_runs_it_in_the_same_thread(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher(refused=()))
    text = make_project(tmp_path, volume=20, refused=())
    ts, run = finished_pilot(h, emulator, text)
    h.decide_via_modal(run["id"], "approve", "pilot passed", user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: [r for r in h.store.list_runs() if r["kind"] == "volume"])
    volume = next(r for r in h.store.list_runs() if r["kind"] == "volume")
    volume = h.settle(volume["id"])
    assert volume["parent_run"] == run["id"] and volume["outcome"] == "passed"
    ref = h.store.message_ref(volume["id"], "status", "slack")
    assert emulator.messages[(CHANNEL, ref["ref"])].thread_ts == ts


def test_typed_decision_outside_a_pilot_thread_is_explained(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    h.mention("approve everything")
    emulator.wait_for(lambda: emulator.ephemerals)
    assert "thread of the pilot" in emulator.ephemerals[0]["text"]
    assert h.store.decisions() == []


def test_two_decisions_at_once_record_exactly_one(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    """Two people submit the decision modal at the same moment: one wins, one is refused."""
    h: Harness = make_harness(ReplayDispatcher())
    ts, run = finished_pilot(h, emulator, make_project(tmp_path))
    start = threading.Barrier(2)

    def submit(decision: str) -> int:
        start.wait(10)
        return h.decide_via_modal(run["id"], decision, f"{decision} it", user=SUBMITTER,
                                  thread_ts=ts)[0]

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(submit, ["revise", "fix-env"])) == [200, 200]
    emulator.wait_for(lambda: len(h.store.decisions(run["id"])) == 2)
    decided = [d for d in h.store.decisions(run["id"]) if d["accepted"]]
    assert len(decided) == 1 and len(refusals(h, run["id"])) == 1
    assert "decided" in refusals(h, run["id"])[0]["refusal"]
    emulator.wait_for(lambda: emulator.ephemerals)
    assert "refused" in emulator.ephemerals[-1]["text"]
    assert h.bot.notifier.flush(30)
    ref = h.store.message_ref(run["id"], "decision", "slack")["ref"]
    final = emulator.messages[(CHANNEL, ref)]
    assert not [b for b in final.blocks if b["type"] == "actions"]
    assert f"{decided[0]['decision']} it" in str(final.blocks)


def test_event_ids_are_claimed_once_across_threads(tmp_path: Path) -> None:
    """Listener threads each use their own SQLite connection; one claim of an id wins."""
    store = Store(tmp_path / "db.sqlite")
    assert store.claim_slack_event("EvMAIN")
    start = threading.Barrier(8)

    def claim(_: int) -> tuple[bool, bool]:
        start.wait(10)
        return store.claim_slack_event("EvRACE"), store.claim_slack_event("EvMAIN")

    with ThreadPoolExecutor(8, thread_name_prefix="slack-listener") as pool:
        results = list(pool.map(claim, range(8)))
    assert sorted(first for first, _ in results) == [False] * 7 + [True]
    assert not any(again for _, again in results)
