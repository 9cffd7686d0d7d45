"""A crashed bot never posts twice and keeps Slack's pace; outcomes missed while it was
down are posted once each, in their own thread, in the order the runs finished."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from slack_sdk import WebClient

from bot.messages.model import Message, Text
from bot.slack.notifier import EVENT_TYPE, SlackNotifier
from bot.store import Store
from tests.slack.conftest import CHANNEL, SUBMITTER, TOKEN, Harness
from tests.slack.crash_notifier import CRASH_CODE
from tests.slack.emulator import BOT_USER, SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project

ROOT = Path(__file__).resolve().parents[2]


def _run_in_thread(store: Store, emulator: SlackEmulator, run_id: str) -> str:
    thread_ts = emulator.user_message(CHANNEL, "<@UPREFLIGHTBOT> pilot", SUBMITTER)
    store.create_run({"id": run_id, "name": "crash", "attempt": 1, "run_dir": "/nonexistent",
                      "channel": CHANNEL, "thread_ts": thread_ts})
    return thread_ts


def _bot_posts(emulator: SlackEmulator, thread_ts: str) -> list[Any]:
    return [m for m in emulator.thread(CHANNEL, thread_ts) if m.user == BOT_USER]


def _status(run_id: str, text: str) -> Message:
    return Message(run_id, "status", (Text(text),), summary=text)


def test_bot_killed_between_post_and_storing_its_ts_posts_once(tmp_path: Path,
                                                               emulator: SlackEmulator) -> None:
    db = tmp_path / "preflight.db"
    store = Store(db)
    run_id = "20260101T000000000Z-crash-a1"
    thread_ts = _run_in_thread(store, emulator, run_id)
    died = subprocess.run([sys.executable, "-m", "tests.slack.crash_notifier", str(db),
                           emulator.api_url, TOKEN, run_id, "stage 1 of 3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert died.returncode == CRASH_CODE, died.stderr  # killed in the gap, by the hook
    assert len(_bot_posts(emulator, thread_ts)) == 1  # Slack has the message...
    assert store.message_ref(run_id, "status", "slack") is None  # ...the store, no ts

    restarted = SlackNotifier(WebClient(token=TOKEN, base_url=emulator.api_url), store,
                              min_interval=0.05)
    try:
        restarted.publish(_status(run_id, "stage 2 of 3"))
        assert restarted.flush(30)
    finally:
        restarted.close()
    posts = _bot_posts(emulator, thread_ts)
    assert len(posts) == 1, [p.text for p in posts]
    assert posts[0].metadata == {"event_type": EVENT_TYPE,
                                 "event_payload": {"run": run_id, "key": "status"}}
    assert "stage 2 of 3" in posts[0].text and posts[0].edits == 1
    assert store.message_ref(run_id, "status", "slack")["ref"] == posts[0].ts
    assert len(emulator.calls_to("chat.postMessage")) == 1
    replies = emulator.calls_to("conversations.replies")
    assert len(replies) == 1 and replies[0].params.get("include_all_metadata") in ("1", "true")


def test_edit_pace_survives_a_restart(tmp_path: Path, emulator: SlackEmulator) -> None:
    store = Store(tmp_path / "preflight.db")
    run_id = "20260101T000000000Z-pace-a1"
    _run_in_thread(store, emulator, run_id)
    client = WebClient(token=TOKEN, base_url=emulator.api_url)
    first = SlackNotifier(client, store, min_interval=0.6)
    first.publish(_status(run_id, "posted"))
    first.close()
    second = SlackNotifier(client, store, min_interval=0.6)  # a restart within the second
    try:
        second.publish(_status(run_id, "edited after the restart"))
        assert second.flush(30)
    finally:
        second.close()
    post, = emulator.calls_to("chat.postMessage")
    edit, = emulator.calls_to("chat.update")
    assert edit.at - post.at >= 0.55  # Slack's pace per message did not restart with us


def test_outcomes_missed_while_down_post_once_in_their_threads_in_finish_order(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path)
    replay = ReplayDispatcher(pause_after=30)
    first: Harness = make_harness(replay)
    ts_a, _ = first.mention(f"```{text}```")
    emulator.wait_for(lambda: len(first.store.list_runs()) == 1)
    ts_b, _ = first.mention(f"```{text}```")
    emulator.wait_for(lambda: len(first.store.list_runs()) == 2)
    runs = {r["thread_ts"]: r["id"] for r in first.store.list_runs()}
    run_a, run_b = runs[ts_a], runs[ts_b]
    for run_id in (run_a, run_b):
        emulator.wait_for(lambda r=run_id: first.store.get_run(r)["last_seq"] >= 30)
    assert first.bot.notifier.flush(30)
    first.close()  # the bot is down; both runners go on and finish: b first, then a
    for run_id in (run_b, run_a):
        replay.release(run_id)
        emulator.wait_for(lambda r=run_id: not replay.is_alive(_Handle(r)))

    second: Harness = make_harness(replay)
    assert sorted(second.bot.resume()) == sorted([run_a, run_b])
    for run_id in (run_a, run_b):
        assert second.settle(run_id)["outcome"] == "passed"
    verdicts = {}
    for run_id, ts in ((run_a, ts_a), (run_b, ts_b)):
        keys = [m.metadata["event_payload"]["key"] for m in _bot_posts(emulator, ts)
                if m.metadata]
        assert sorted(keys) == sorted(set(keys)), keys  # each message once
        assert {"plan", "status", "verdict", "balance"} <= set(keys)
        assert all(m.metadata["event_payload"]["run"] == run_id
                   for m in _bot_posts(emulator, ts) if m.metadata)  # the right thread
        verdicts[run_id] = second.store.message_ref(run_id, "verdict", "slack")["ref"]
    assert float(verdicts[run_b]) < float(verdicts[run_a])  # in the order they finished


class _Handle:
    """What ReplayDispatcher.is_alive reads from a handle: the run id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
