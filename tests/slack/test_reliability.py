"""Retries, forged requests, rate limits and a restart in the middle of a run."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.events_check import assert_recorded_whole
from tests.slack.conftest import CHANNEL, TOKEN, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project


def first_run(h: Harness, emulator: SlackEmulator) -> str:
    emulator.wait_for(lambda: h.store.list_runs())
    return str(h.store.list_runs()[0]["id"])


def test_slack_retry_with_same_event_id_starts_one_run(tmp_path: Path, emulator: SlackEmulator,
                                                       make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    ts, (status, _) = h.mention(f"```{text}```", event_id="EvDUPLICATE")
    assert status == 200
    event = {"type": "app_mention", "user": "U0SUBMITTER", "channel": CHANNEL, "ts": ts,
             "text": f"<@UPREFLIGHTBOT> ```{text}```"}
    for n in (1, 2):
        status, _ = h.event(event, event_id="EvDUPLICATE",
                            headers={"X-Slack-Retry-Num": str(n),
                                     "X-Slack-Retry-Reason": "http_timeout"})
        assert status == 200
    run_id = first_run(h, emulator)
    h.wait_status(run_id, ("awaiting_decision",))
    assert len(h.store.list_runs()) == 1
    assert len(h.dispatcher.started) == 1  # type: ignore[attr-defined]


def test_forged_and_stale_requests_are_refused_and_change_nothing(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher())
    _, (status, _) = h.mention(f"```{text}```", signature="v0=" + "0" * 64)
    assert status == 401
    _, (status, _) = h.mention(f"```{text}```", timestamp=int(time.time()) - 6 * 60)
    assert status == 401
    body = "command=/preflight&text=runs&user_id=U1&channel_id=C1&trigger_id=t"
    status, _ = h.post(body, "application/x-www-form-urlencoded", signature="v0=forged")
    assert status == 401
    assert h.store.list_runs() == []
    assert not h.store.db.execute("SELECT COUNT(*) FROM slack_events").fetchone()[0]
    assert emulator.calls_to("chat.postMessage") == []
    _, (status, _) = h.mention("help")
    assert status == 200  # a genuine request still goes through
    emulator.wait_for(lambda: emulator.calls_to("chat.postMessage"))


def test_rate_limit_storm_during_a_run_delivers_every_message(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path)
    h: Harness = make_harness(ReplayDispatcher(pause_after=20))
    ts, _ = h.mention(f"```{text}```")
    run_id = first_run(h, emulator)
    emulator.wait_for(lambda: h.store.message_ref(run_id, "status", "slack"))
    emulator.rate_limit(4, retry_after=1)  # the next four calls, whatever they are, get 429
    h.dispatcher.release()  # type: ignore[attr-defined]
    assert h.settle(run_id)["status"] == "awaiting_decision"
    limited = [c for c in emulator.calls if c.status == 429]
    assert len(limited) == 4
    posted = Counter(c.params.get("text", "")[:20] for c in emulator.calls_to("chat.postMessage"))
    assert all(n == 1 for n in posted.values()), posted
    for key in ("plan", "status", "balance", "evidence", "verdict", "decision"):
        assert h.store.message_ref(run_id, key, "slack"), key
    status_ref = h.store.message_ref(run_id, "status", "slack")["ref"]
    final = emulator.messages[(CHANNEL, status_ref)]
    assert "passed" in final.text
    assert all(m.thread_ts == ts for m in emulator.thread(CHANNEL, ts)[1:])


def test_restart_mid_run_continues_without_duplicate_posts(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    text = make_project(tmp_path)
    replay = ReplayDispatcher(pause_after=30)
    first: Harness = make_harness(replay)
    ts, _ = first.mention(f"```{text}```")
    run_id = first_run(first, emulator)
    emulator.wait_for(lambda: first.store.get_run(run_id)["last_seq"] >= 30)
    assert first.bot.notifier.flush(30)
    first.close()
    seq_at_stop = first.store.get_run(run_id)["last_seq"]
    posts_before = len(emulator.calls_to("chat.postMessage"))

    second: Harness = make_harness(replay)  # same SQLite file, same runner still going
    assert second.bot.resume() == [run_id]
    replay.release()
    run = second.settle(run_id)
    assert run["outcome"] == "passed"
    assert seq_at_stop == 30 and run["last_seq"] > seq_at_stop
    assert_recorded_whole(second.store, run_id)  # item events included, progress folded
    thread = emulator.thread(CHANNEL, ts)[1:]
    refs = [second.store.message_ref(run_id, k, "slack")["ref"] for k in
            ("plan", "status", "balance", "evidence", "verdict", "decision")]
    assert sorted(refs) == sorted(m.ts for m in thread), [m.text for m in thread]
    assert posts_before == 2  # plan and status, posted by the first bot, never again
    status_ref = second.store.message_ref(run_id, "status", "slack")["ref"]
    assert emulator.messages[(CHANNEL, status_ref)].edits >= 1


def test_bad_token_is_refused_by_the_emulator(emulator: SlackEmulator) -> None:
    from slack_sdk import WebClient
    from slack_sdk.errors import SlackApiError

    client = WebClient(token="xoxb-wrong", base_url=emulator.api_url)
    try:
        client.auth_test()
    except SlackApiError as exc:
        assert exc.response["error"] == "invalid_auth"
    else:
        raise AssertionError("a bad token must be refused")
    assert WebClient(token=TOKEN, base_url=emulator.api_url).auth_test()["ok"]
