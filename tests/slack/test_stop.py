"""Stopping a run from Slack: the Stop button of a running run, and `/preflight stop RUN`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.slack.conftest import APPROVER, CHANNEL, SUBMITTER, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project
from tests.slack.test_reliability import first_run


def stop_via_modal(h: Harness, run_id: str, reason: str, *, user: str,
                   thread_ts: str) -> tuple[int, str]:
    values = {"reason": {"value": {"type": "plain_text_input", "value": reason}}}
    return h.submit_view("preflight_decide", values,
                         {"run": run_id, "decision": "stop", "channel": CHANNEL,
                          "thread_ts": thread_ts}, user=user)


def test_stop_button_stops_a_running_pilot_with_who_and_why(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher(pause_after=20))
    ts, _ = h.mention(f"```{make_project(tmp_path)}```")
    run_id = first_run(h, emulator)
    emulator.wait_for(lambda: h.store.message_ref(run_id, "status", "slack"))
    ref = h.store.message_ref(run_id, "status", "slack")["ref"]
    emulator.wait_for(lambda: "preflight_stop" in json.dumps(emulator.messages[(CHANNEL, ref)]
                                                             .blocks))
    h.click("stop", run_id, user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: emulator.views)
    view = next(iter(emulator.views.values()))
    assert "Stop the run" in json.dumps(view)
    stop_via_modal(h, run_id, "wrong inputs", user=APPROVER, thread_ts=ts)
    run = h.settle(run_id)
    assert run["status"] == "stopped"
    assert (run["stop"]["by"], run["stop"]["reason"]) == (APPROVER, "wrong inputs")
    emulator.wait_for(lambda: any(":octagonal_sign:" in m.text
                                  for m in emulator.thread(CHANNEL, ts)))
    final = emulator.messages[(CHANNEL, ref)]
    assert "preflight_stop" not in json.dumps(final.blocks)  # no Stop button once ended
    h.click("stop", run_id, user=APPROVER, thread_ts=ts)  # a second click: told, not done
    emulator.wait_for(lambda: emulator.ephemerals)
    assert "only a running run can be stopped" in emulator.ephemerals[-1]["text"]


def test_slash_stop_needs_a_reason_and_stops_the_run(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher(pause_after=20))
    h.mention(f"```{make_project(tmp_path)}```")
    run_id = first_run(h, emulator)
    h.wait_status(run_id, ("running",))
    _, body = h.command(f"stop {run_id}")
    assert "Usage" in body and h.store.get_run(run_id)["status"] == "running"
    _, body = h.command(f"stop {run_id[:14]} lease ends tonight", user=SUBMITTER)
    assert "Stopping" in body
    run = h.settle(run_id)
    assert run["status"] == "stopped" and run["stop"]["by"] == SUBMITTER
    assert run["stop"]["reason"] == "lease ends tonight"
