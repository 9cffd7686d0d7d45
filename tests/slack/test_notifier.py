"""SlackNotifier: coalesced edits, the last state delivered, stored ts, rate limits."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bot.messages.model import Message, Text
from bot.slack.app import RedactTokens, install_log_redaction, make_client
from bot.slack.notifier import SlackNotifier
from bot.store import Store
from tests.slack.conftest import CHANNEL, TOKEN, make_settings
from tests.slack.emulator import SlackEmulator


def make_run(store: Store, run_id: str, thread_ts: str) -> None:
    store.create_run({"id": run_id, "name": "n", "attempt": 1, "run_dir": "/nowhere",
                      "channel": CHANNEL, "thread_ts": thread_ts})


def test_updates_are_coalesced_to_one_per_second_and_the_last_state_wins(
        tmp_path: Path, emulator: SlackEmulator) -> None:
    store = Store(tmp_path / "db.sqlite")
    root = emulator.user_message(CHANNEL, "root", "U1")
    make_run(store, "r1", root)
    notifier = SlackNotifier(make_client(make_settings(tmp_path, emulator)), store)
    for i in range(40):
        notifier.publish(Message("r1", "status", (Text(f"state {i}"),), summary=f"state {i}"))
    assert notifier.flush(30)
    notifier.close()
    ts = store.message_ref("r1", "status", "slack")["ref"]
    assert emulator.messages[(CHANNEL, ts)].text == "state 39"
    assert len(emulator.calls_to("chat.postMessage")) == 1
    updates = emulator.calls_to("chat.update")
    assert 1 <= len(updates) < 40
    gaps = [b.at - a.at for a, b in zip(updates, updates[1:])]
    assert all(g >= 0.95 for g in gaps), gaps


def test_restarted_notifier_updates_the_stored_message(tmp_path: Path,
                                                       emulator: SlackEmulator) -> None:
    store = Store(tmp_path / "db.sqlite")
    make_run(store, "r1", emulator.user_message(CHANNEL, "root", "U1"))
    client = make_client(make_settings(tmp_path, emulator))
    first = SlackNotifier(client, store)
    first.publish(Message("r1", "plan", (Text("v1"),), summary="v1"))
    first.close()
    second = SlackNotifier(client, Store(tmp_path / "db.sqlite"))
    second.publish(Message("r1", "plan", (Text("v2"),), summary="v2"))
    second.close()
    assert len(emulator.calls_to("chat.postMessage")) == 1
    assert [c.params["text"] for c in emulator.calls_to("chat.update")] == ["v2"]


def test_rate_limited_post_is_retried_after_retry_after(tmp_path: Path,
                                                        emulator: SlackEmulator) -> None:
    store = Store(tmp_path / "db.sqlite")
    make_run(store, "r1", emulator.user_message(CHANNEL, "root", "U1"))
    notifier = SlackNotifier(make_client(make_settings(tmp_path, emulator)), store)
    emulator.rate_limit(2, method="chat.postMessage")
    notifier.publish(Message("r1", "plan", (Text("hello"),), summary="hello"))
    notifier.close()
    assert [c.status for c in emulator.calls if c.method == "chat.postMessage"] == [429, 429, 200]
    assert store.message_ref("r1", "plan", "slack") is not None


def test_runs_without_a_slack_channel_are_not_posted(tmp_path: Path,
                                                     emulator: SlackEmulator) -> None:
    store = Store(tmp_path / "db.sqlite")
    store.create_run({"id": "r1", "name": "n", "attempt": 1, "run_dir": "/nowhere"})
    notifier = SlackNotifier(make_client(make_settings(tmp_path, emulator)), store)
    notifier.publish(Message("r1", "plan", (Text("hello"),)))
    notifier.close()
    assert emulator.calls == []


def test_tokens_are_redacted_from_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.redact")
    logger.addFilter(RedactTokens())
    with caplog.at_level(logging.INFO, logger="test.redact"):
        logger.info("calling with %s and xapp-1-abc", TOKEN)
    assert TOKEN not in caplog.text and "xapp-1-abc" not in caplog.text
    assert "redacted" in caplog.text


def test_tokens_are_redacted_from_tracebacks(tmp_path: Path) -> None:
    """A token inside an exception's message is redacted from the logged traceback too."""
    logger = logging.getLogger("test.redact.traceback")
    logger.propagate = False
    path = tmp_path / "bot.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    install_log_redaction(logger)
    try:
        try:
            raise RuntimeError(f"request with Authorization: Bearer {TOKEN} failed")
        except RuntimeError:
            logger.exception("posting failed for %s", "xapp-1-A1-2-secret")
    finally:
        handler.close()
        logger.removeHandler(handler)
    text = path.read_text()
    assert "RuntimeError" in text and "Traceback" in text
    assert TOKEN not in text and "xapp-1-A1-2-secret" not in text
    assert text.count("xox…(redacted)") == 2
