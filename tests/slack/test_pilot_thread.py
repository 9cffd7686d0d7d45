"""The pilot thread end to end over real HTTP: mention → plan → status → balance → decide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.slack.conftest import APPROVER, CHANNEL, SUBMITTER, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project

KEYS_IN_ORDER = ["plan", "status", "balance", "evidence", "verdict", "decision"]


def thread_texts(emulator: SlackEmulator, ts: str) -> list[str]:
    return [m.text for m in emulator.thread(CHANNEL, ts) if m.ts != ts]


def all_text(blocks: list[dict[str, Any]]) -> str:
    out = []
    for b in blocks:
        if "text" in b and isinstance(b["text"], dict):
            out.append(b["text"].get("text", ""))
        for f in b.get("fields") or []:
            out.append(f.get("text", ""))
        for e in b.get("elements") or []:
            if isinstance(e.get("text"), str):
                out.append(e["text"])
            elif isinstance(e.get("text"), dict):
                out.append(e["text"].get("text", ""))
    return "\n".join(out)


def test_twelve_document_pilot_from_mention_to_balance(tmp_path: Path, emulator: SlackEmulator,
                                                       make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    ts, (status, _) = h.mention(f"please run this\n```yaml\n{text}```")
    assert status == 200
    run = h.settle(h_run_id(h, emulator))
    assert run["outcome"] == "passed", run["verdict"]
    thread = emulator.thread(CHANNEL, ts)[1:]  # [0] is the user's own message
    keys = [k for k in KEYS_IN_ORDER if h.store.message_ref(run["id"], k, "slack")]
    assert keys == KEYS_IN_ORDER
    assert len(thread) == len(KEYS_IN_ORDER), [m.text for m in thread]
    status_msg = next(m for m in thread if m.ts == h.store.message_ref(run["id"], "status",
                                                                       "slack")["ref"])
    assert status_msg.edits >= 1
    body = all_text(status_msg.blocks)
    for stage in ("prepare", "torch", "pilot", "balance", "evidence"):
        assert f"*{stage}* passed" in body
    balance = all_text(next(m for m in thread if m.text.startswith("Balance")).blocks)
    assert "doc-07" in balance and "11" in balance
    decision = next(m for m in thread if "awaiting a decision" in m.text)
    buttons = [e["action_id"] for b in decision.blocks if b["type"] == "actions"
               for e in b["elements"]]
    assert buttons == ["preflight_approve", "preflight_fix-env", "preflight_revise"]
    assert not [c for c in emulator.calls if c.error and c.method.startswith("chat.")]


def h_run_id(h: Harness, emulator: SlackEmulator) -> str:
    emulator.wait_for(lambda: h.store.list_runs())
    return str(h.store.list_runs()[0]["id"])


def test_invalid_manifest_gets_field_line_and_message(tmp_path: Path, emulator: SlackEmulator,
                                                     make_harness: Any) -> None:
    text = make_project(tmp_path).replace("lots: 1", "lots: 99").replace("backend: cpu",
                                                                          "backend: cuda\nbogus: 1")
    h: Harness = make_harness(ReplayDispatcher())
    ts, (status, _) = h.mention(f"```{text}```")
    assert status == 200
    reply = emulator.wait_for(lambda: thread_texts(emulator, ts))
    assert "not valid" in reply[0]
    body = all_text(emulator.thread(CHANNEL, ts)[-1].blocks)
    assert "hardware.lots" in body and "line" in body
    assert "bogus" in body
    assert h.store.list_runs() == []
    assert h.dispatcher.started == []  # type: ignore[attr-defined]


def test_slack_escaped_manifest_is_unescaped(tmp_path: Path, emulator: SlackEmulator,
                                             make_harness: Any) -> None:
    text = make_project(tmp_path)
    escaped = text.replace("# The 12-document", "# A & B <test> The 12-document")
    escaped = escaped.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    h: Harness = make_harness(ReplayDispatcher())
    h.mention(f"```yaml\n{escaped}```")
    run_id = h_run_id(h, emulator)
    assert "# A & B <test>" in h.store.get_run(run_id)["manifest_text"]
    assert ">=3.9" in h.store.get_run(run_id)["manifest_text"]
    h.wait_status(run_id, ("awaiting_decision",))


def test_manifest_file_shared_with_a_mention(tmp_path: Path, emulator: SlackEmulator,
                                            make_harness: Any) -> None:
    text = make_project(tmp_path)
    shared = emulator.add_file("pilote.yaml", text.encode())
    h: Harness = make_harness(ReplayDispatcher())
    h.mention("here is the file", files=[shared])
    run_id = h_run_id(h, emulator)
    assert h.store.get_run(run_id)["manifest_text"] == text
    downloads = [c for c in emulator.calls if c.method == "file.download"]
    assert len(downloads) == 1 and downloads[0].status == 200
    h.wait_status(run_id, ("awaiting_decision",))


def test_other_channels_get_a_polite_refusal(tmp_path: Path, emulator: SlackEmulator,
                                             make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher(), channels=frozenset({CHANNEL}))
    h.mention(f"```{text}```", channel="C0ELSEWHERE")
    emulator.wait_for(lambda: emulator.ephemerals)
    assert "only runs pilots in its own channels" in emulator.ephemerals[0]["text"]
    assert h.store.list_runs() == []
    status, body = h.command("runs", channel="C0ELSEWHERE")
    assert status == 200 and "only runs in its own channels" in body


def test_bot_messages_are_ignored(tmp_path: Path, emulator: SlackEmulator,
                                  make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    ts = "1700000000.000001"
    status, _ = h.event({"type": "app_mention", "channel": CHANNEL, "ts": ts, "user": "U0OTHERBOT",
                         "bot_id": "B0OTHER", "text": f"<@UPREFLIGHTBOT> ```{text}```"})
    assert status == 200
    h.mention("help")  # a later human mention is answered, so the first one was processed
    emulator.wait_for(lambda: emulator.calls_to("chat.postMessage"))
    assert h.store.list_runs() == []
    assert len(emulator.calls_to("chat.postMessage")) == 1


def test_submitter_identity_and_approval_by_approver(tmp_path: Path, emulator: SlackEmulator,
                                                     make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    ts, _ = h.mention(f"```{text}```", user=SUBMITTER)
    run = h.settle(h_run_id(h, emulator))
    assert run["submitter"] == SUBMITTER and run["channel"] == CHANNEL and run["thread_ts"] == ts
    status, _ = h.decide_via_modal(run["id"], "approve", "balance reviewed", user=APPROVER,
                                   thread_ts=ts)
    assert status == 200
    run = h.decided(run["id"])
    ref = h.store.message_ref(run["id"], "decision", "slack")
    msg = emulator.messages[(CHANNEL, ref["ref"])]
    assert not [b for b in msg.blocks if b["type"] == "actions"]
    assert "balance reviewed" in all_text(msg.blocks)
