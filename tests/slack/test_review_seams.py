"""Review of the seam between the Slack transport and the service: failures that went quiet."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from bot.dispatch.base import RunHandle
from bot.errors import LeaseError
from runner.events import Event
from tests.slack.conftest import APPROVER, CHANNEL, SUBMITTER, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project


class FlakyDispatcher(ReplayDispatcher):
    """Reading the events fails ``failures`` times with an unexpected error (a flaky disk)."""

    def __init__(self, failures: int) -> None:
        super().__init__(pause_after=10)
        self.failures = failures
        self._lock = threading.Lock()

    def read_events(self, handle: RunHandle, offset: int) -> tuple[list[Event], int]:
        with self._lock:
            if offset > 0 and self.failures > 0:
                self.failures -= 1
                raise RuntimeError("I/O hiccup while reading events.jsonl")
        return super().read_events(handle, offset)


def refuse_lease(run: dict[str, Any]) -> None:
    raise LeaseError("node gpu-1 is 'ordered': runs need a provisioned lease")


def thread_texts(emulator: SlackEmulator, ts: str) -> str:
    return "\n".join(m.text + str(m.blocks) for m in emulator.thread(CHANNEL, ts))


def test_follower_survives_an_unexpected_error_and_finishes_the_run(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(FlakyDispatcher(failures=2))
    h.mention(f"```{text}```")
    emulator.wait_for(lambda: h.store.list_runs())
    run_id = str(h.store.list_runs()[0]["id"])
    emulator.wait_for(lambda: h.store.get_run(run_id)["last_seq"] >= 10)
    h.dispatcher.release()  # type: ignore[attr-defined]
    assert h.settle(run_id, timeout=20)["status"] == "awaiting_decision"


def test_a_lease_refusal_at_dispatch_is_told_in_the_thread(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    h.service.starter.lease_guard = h.service.decider.lease_guard = refuse_lease
    ts, _ = h.mention(f"```{text}```")
    assert emulator.wait_for(lambda: "provisioned lease" in thread_texts(emulator, ts), 10), \
        "the refusal never reached the thread"
    assert h.only_run()["status"] == "planned"


def test_a_lease_refusal_of_the_volume_run_is_told_in_the_thread(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path, volume=3)
    h: Harness = make_harness(ReplayDispatcher())
    ts, _ = h.mention(f"```{text}```")
    emulator.wait_for(lambda: h.store.list_runs())
    run_id = str(h.store.list_runs()[0]["id"])
    h.settle(run_id)
    h.service.starter.lease_guard = h.service.decider.lease_guard = refuse_lease
    h.mention("approve balance reviewed", user=APPROVER, thread_ts=ts)
    # The approval is refused before it is recorded (issue 27), told to the approver in the
    # thread (privately, as every refused decision), naming the lease.
    assert emulator.wait_for(lambda: any(
        "provisioned lease" in e["text"] and e["thread_ts"] == ts and e["user"] == APPROVER
        for e in emulator.ephemerals), 10), "the volume run's refusal never reached the thread"
    # The pilot stays approvable and no volume run was made.
    assert h.store.get_run(run_id)["status"] == "awaiting_decision"
    assert [r["id"] for r in h.store.list_runs()] == [run_id]


def test_a_tampered_button_value_decides_nothing(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    ts, _ = h.mention(f"```{text}```")
    emulator.wait_for(lambda: h.store.list_runs())
    run_id = str(h.store.list_runs()[0]["id"])
    h.settle(run_id)
    # A prefix of the id (find_run accepts one) and the right id clicked from another channel.
    h.click("revise", run_id[:10], user=SUBMITTER, thread_ts=ts)
    emulator.wait_for(lambda: len(emulator.ephemerals) >= 1)
    h.click("revise", run_id, user=SUBMITTER, thread_ts="999.1", channel="C0ELSEWHERE")
    emulator.wait_for(lambda: len(emulator.ephemerals) >= 2)
    assert emulator.views == {}
    h.submit_view("preflight_decide", {"reason": {"value": {"value": "tampered"}}},
                  {"run": run_id[:10], "decision": "revise", "channel": CHANNEL,
                   "thread_ts": ts}, user=SUBMITTER)
    emulator.wait_for(lambda: len(emulator.ephemerals) >= 3)
    assert h.store.get_run(run_id)["status"] == "awaiting_decision"
    assert not [d for d in h.store.decisions(run_id) if d["accepted"]]


def test_a_typed_decision_in_a_thread_of_no_run_is_answered(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    root = emulator.user_message(CHANNEL, "lunch?", "U0SOMEONE")
    h.mention("approve looks fine", user=APPROVER, thread_ts=root)
    emulator.wait_for(lambda: emulator.ephemerals)
    assert "thread of the pilot" in emulator.ephemerals[-1]["text"]
    assert h.store.list_runs() == []
