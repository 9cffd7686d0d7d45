"""/preflight subcommands, the submit modal, the App Home tab, big balances."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.slack.conftest import CHANNEL, SUBMITTER, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project


def test_help_runs_and_status_are_answered_in_the_ack(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    status, body = h.command("help")
    assert status == 200 and "/preflight run NAME" in body
    status, body = h.command("runs")
    assert "No runs yet" in body
    status, body = h.command("status nope")
    assert "no run 'nope'" in body


def test_lease_commands_record_who_and_refuse_skipped_states(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    _, body = h.command("lease")
    assert "No open lease" in body
    _, body = h.command("lease gpu-1.example provisioned")
    assert "starts at 'ordered'" in body
    _, body = h.command("lease gpu-1.example ordered quote 42")
    assert "now *ordered*" in body
    _, body = h.command("lease gpu-1.example provisioned")
    assert "payment-notified" in body  # one step at a time: refused, naming the next state
    h.command("lease gpu-1.example payment-notified")
    _, body = h.command("lease gpu-1.example")
    assert "payment-notified" in body
    lease = h.service.store.current_lease("gpu-1.example")
    assert lease is not None and lease["state"] == "payment-notified"
    history = h.service.store.lease_changes(int(lease["id"]))
    assert [(e["to_state"], e["by"]) for e in history] == [
        ("ordered", f"<@{SUBMITTER}>"), ("payment-notified", f"<@{SUBMITTER}>")]


def test_run_named_manifest_opens_a_thread_and_runs(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    status, body = h.command("run ../etc/passwd")
    assert "No manifest" in body
    status, body = h.command("run pilote")
    assert status == 200 and "Starting" in body
    emulator.wait_for(lambda: h.store.list_runs())
    run = h.settle(h.store.list_runs()[0]["id"])
    root = emulator.messages[(CHANNEL, run["thread_ts"])]
    assert root.thread_ts is None and "started the pilot" in root.text
    assert run["submitter"] == SUBMITTER and run["outcome"] == "passed"
    status, body = h.command(f"status {run['id']}")
    assert run["id"] in body and "awaiting_decision" in body


def test_submit_modal_with_text_and_with_a_file(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    h.command("submit")
    emulator.wait_for(lambda: emulator.views)
    view = next(iter(emulator.views.values()))
    assert view["callback_id"] == "preflight_submit"
    element = view["blocks"][0]["element"]
    assert element["max_length"] == 3000 and view["blocks"][1]["element"]["type"] == "file_input"
    status, body = h.submit_view("preflight_submit", {}, {"channel": CHANNEL}, user=SUBMITTER)
    assert "errors" in body and h.store.list_runs() == []
    values = {"manifest": {"value": {"type": "plain_text_input", "value": text}}}
    h.submit_view("preflight_submit", values, {"channel": CHANNEL}, user=SUBMITTER)
    emulator.wait_for(lambda: h.store.list_runs())
    shared = emulator.add_file("big.yaml", text.encode())
    values = {"manifest_file": {"value": {"type": "file_input", "files": [shared]}}}
    h.submit_view("preflight_submit", values, {"channel": CHANNEL}, user=SUBMITTER)
    emulator.wait_for(lambda: len(h.store.list_runs()) == 2)
    for run in h.store.list_runs():
        assert h.settle(run["id"])["outcome"] == "passed"


def test_app_home_shows_active_pilots_and_recent_decisions(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher())
    ts, _ = h.mention(f"```{make_project(tmp_path)}```")
    emulator.wait_for(lambda: h.store.list_runs())
    run = h.settle(h.store.list_runs()[0]["id"])
    h.event({"type": "app_home_opened", "user": SUBMITTER, "channel": "D0HOME", "tab": "home"})
    emulator.wait_for(lambda: emulator.home.get(SUBMITTER))
    active, _, decisions = json.dumps(emulator.home.pop(SUBMITTER)).partition("Recent decisions")
    assert run["id"] in active and "awaiting_decision" in active and "stage evidence" in active
    assert "No decision recorded yet" in decisions
    h.mention("fix-env the driver is old", thread_ts=ts)
    h.wait_status(run["id"], ("decided",))
    h.event({"type": "app_home_opened", "user": SUBMITTER, "channel": "D0HOME", "tab": "home"})
    emulator.wait_for(lambda: emulator.home.get(SUBMITTER))
    active, _, decisions = json.dumps(emulator.home[SUBMITTER]).partition("Recent decisions")
    assert run["id"] not in active and "No pilot is running" in active
    assert f"<@{SUBMITTER}>" in decisions and "*fix-env*" in decisions
    assert run["id"] in decisions and "the driver is old" in decisions


def test_five_thousand_item_balance_goes_out_as_summary_plus_csv(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path, count=5000, refused=("doc-07",))
    text = text.replace('pattern: "doc-*.txt"', 'pattern: "doc-*.txt"')
    h: Harness = make_harness(ReplayDispatcher())
    h.mention(f"```{text}```")
    emulator.wait_for(lambda: h.store.list_runs(), timeout=60)
    run = h.settle(h.store.list_runs()[0]["id"], timeout=120)
    assert run["balance"]["total"] == 5000 and run["outcome"] == "passed"
    ref = h.store.message_ref(run["id"], "balance", "slack")
    msg = emulator.messages[(CHANNEL, ref["ref"])]
    assert len(msg.blocks) <= 50
    body = json.dumps(msg.blocks)
    assert "of 5000 rows shown" in body and "balance.csv" in body
    uploads = emulator.calls_to("files.completeUploadExternal")
    # balance.csv once (the report and its picture go with the verdict, see test_forecast_slack)
    assert len([u for u in uploads if "balance.csv" in u.params["files"]]) == 1
    stored = next(f for f in emulator.files.values() if f["name"] == "balance.csv")
    assert stored["thread_ts"] == run["thread_ts"]
    assert stored["content"].decode().count("\n") == 5001


def test_a_channel_the_bot_is_not_in_gets_a_private_answer(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    """Slack refuses the thread's first post (not_in_channel): nothing starts, the user is told."""
    text = make_project(tmp_path)
    emulator.not_in_channel.add("C0NOTIN")
    h: Harness = make_harness(ReplayDispatcher())
    status, body = h.command("run pilote", channel="C0NOTIN")
    assert status == 200 and "Starting" in body
    told = emulator.wait_for(lambda: emulator.responses)
    assert "/invite @preflight" in told[0]["text"] and told[0]["response_type"] == "ephemeral"
    h.command("submit", channel="C0NOTIN")
    view = emulator.wait_for(lambda: list(emulator.views.values()))[0]
    meta = json.loads(view["private_metadata"])
    assert meta["channel"] == "C0NOTIN" and meta["response_url"].startswith(emulator.url)
    values = {"manifest": {"value": {"type": "plain_text_input", "value": text}}}
    h.submit_view("preflight_submit", values, meta, user=SUBMITTER)
    emulator.wait_for(lambda: len(emulator.responses) == 2)
    assert "/invite @preflight" in emulator.responses[1]["text"]
    assert h.store.list_runs() == [] and h.dispatcher.started == []  # type: ignore[attr-defined]
