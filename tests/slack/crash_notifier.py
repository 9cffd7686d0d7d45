"""A bot process that dies in the gap between ``chat.postMessage`` and storing its ts.

``python -m tests.slack.crash_notifier DB API_URL TOKEN RUN_ID TEXT`` publishes the run's
status message through the real SlackNotifier, whose fault hook ends the process with
``os._exit(9)`` right after Slack accepted the post: nothing after it runs, as in a crash.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from slack_sdk import WebClient

from bot.messages.model import Message, Text
from bot.slack.notifier import SlackNotifier
from bot.store import Store

CRASH_CODE = 9


def crash(point: str, message: Message) -> None:
    if point == "posted":
        os._exit(CRASH_CODE)


def main(db: str, api_url: str, token: str, run_id: str, text: str) -> int:
    store = Store(Path(db))
    notifier = SlackNotifier(WebClient(token=token, base_url=api_url), store, fault=crash)
    notifier.publish(Message(run_id, "status", (Text(text),), summary=text))
    notifier.close(10)
    return 0  # only if the hook did not fire


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
