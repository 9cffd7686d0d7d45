"""Fixtures: the Web API emulator, and a bot served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import itertools
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from slack_sdk.signature import SignatureVerifier

from bot.dispatch.base import Dispatcher
from bot.policy import Policy, load_policy
from bot.service import PilotService
from bot.settings import Settings
from bot.slack.app import SlackBot, SlackTransport
from bot.slack.server import HttpServer
from bot.store import Store
from tests.slack.emulator import SlackEmulator

TOKEN = "xoxb-test-token"
SECRET = "test-signing-secret"
CHANNEL = "C0PILOTS"
SUBMITTER = "U0SUBMITTER"
APPROVER = "U0APPROVER"
# The team's policy the Slack tests run under (tests/slack/test_policy.py attacks others):
# local runs with commands allowed, the test's own directory as the project root.
TEAM_POLICY = """\
roles:
  approvers: [U0APPROVER, U0SUBMITTER]
  lease_operators: [U0SUBMITTER]
nodes: [local]
project_roots: [{root}]
task_command: {{local: true}}
"""


def team_policy(root: Path, text: str | None = None) -> Policy:
    """A policy file written under ``root`` and read by the real loader."""
    path = root / "policy.yaml"
    path.write_text(text if text is not None else TEAM_POLICY.format(root=root),
                    encoding="utf-8")
    return load_policy(path, home=root)


@pytest.fixture
def emulator() -> Iterator[SlackEmulator]:
    with SlackEmulator(tokens=(TOKEN,)) as emu:
        yield emu


def make_settings(root: Path, emu: SlackEmulator, **changes: Any) -> Settings:
    base = Settings(home=root, db_path=root / "state" / "preflight.db",
                    jobs_db_path=root / "state" / "jobs.db", runs_dir=root / "runs",
                    python=sys.executable, slack_bot_token=TOKEN, slack_signing_secret=SECRET,
                    slack_api_url=emu.api_url, manifests_dir=root / "manifests")
    return base.with_(**changes) if changes else base


class Harness:
    """A service + SlackBot + uvicorn on port 0, and a signed-request client for it."""

    _ids = itertools.count(1)

    def __init__(self, settings: Settings, dispatcher: Dispatcher, emulator: SlackEmulator, *,
                 min_interval: float = 1.0, policy: Policy | None = None) -> None:
        self.settings = settings
        self.emulator = emulator
        self.store = Store(settings.db_path)
        self.dispatcher = dispatcher
        transport = SlackTransport(settings, min_interval=min_interval)
        self.service = PilotService(settings, self.store, {"local": dispatcher},
                                    transport.notifier(self.store),
                                    policy=policy or team_policy(settings.home),
                                    directory=transport.directory)
        self.bot = SlackBot(settings, self.service, transport)
        self.server = HttpServer(self.bot.app).start()
        self.verifier = SignatureVerifier(settings.slack_signing_secret or "")

    def close(self) -> None:
        self.server.stop()
        self.bot.close()

    # -- signed requests ---------------------------------------------------------------
    def post(self, body: str, content_type: str, *, timestamp: int | None = None,
             signature: str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, str]:
        ts = str(int(time.time()) if timestamp is None else timestamp)
        sig = signature or self.verifier.generate_signature(timestamp=ts, body=body)
        request = urllib.request.Request(self.server.url, data=body.encode(), method="POST",
                                         headers={"Content-Type": content_type,
                                                  "X-Slack-Request-Timestamp": ts,
                                                  "X-Slack-Signature": sig, **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def event(self, event: dict[str, Any], *, event_id: str | None = None,
              **kw: Any) -> tuple[int, str]:
        body = json.dumps({"token": "legacy", "team_id": "T0PREFLIGHT", "api_app_id": "A0APP",
                           "type": "event_callback", "event": event,
                           "event_id": event_id or f"Ev{next(self._ids):08d}",
                           "event_time": int(time.time())})
        return self.post(body, "application/json", **kw)

    def mention(self, text: str, *, user: str = SUBMITTER, channel: str = CHANNEL,
                thread_ts: str | None = None, files: list[dict[str, Any]] | None = None,
                **kw: Any) -> tuple[str, tuple[int, str]]:
        full = f"<@UPREFLIGHTBOT> {text}"
        ts = self.emulator.user_message(channel, full, user, thread_ts)
        event = {"type": "app_mention", "user": user, "channel": channel, "ts": ts,
                 "text": full, "event_ts": ts}
        if thread_ts:
            event["thread_ts"] = thread_ts
        if files:
            event["files"] = files
        return ts, self.event(event, **kw)

    def command(self, text: str, *, user: str = SUBMITTER,
                channel: str = CHANNEL) -> tuple[int, str]:
        n = next(self._ids)
        body = urlencode({"command": "/preflight", "text": text, "user_id": user,
                          "channel_id": channel, "team_id": "T0PREFLIGHT",
                          "trigger_id": f"trig{n}",
                          "response_url": f"{self.emulator.url}/response/cmd{n}"})
        return self.post(body, "application/x-www-form-urlencoded")

    def interact(self, payload: dict[str, Any]) -> tuple[int, str]:
        body = urlencode({"payload": json.dumps(payload)})
        return self.post(body, "application/x-www-form-urlencoded")

    def click(self, action: str, run_id: str, *, user: str, thread_ts: str,
              channel: str = CHANNEL) -> tuple[int, str]:
        return self.interact({
            "type": "block_actions", "user": {"id": user}, "team": {"id": "T0PREFLIGHT"},
            "api_app_id": "A0APP", "trigger_id": f"trig{next(self._ids)}",
            "channel": {"id": channel}, "container": {"type": "message", "channel_id": channel},
            "message": {"ts": "1.0", "thread_ts": thread_ts},
            "actions": [{"action_id": f"preflight_{action}", "value": run_id,
                         "type": "button", "block_id": "preflight_decision"}]})

    def submit_view(self, callback_id: str, values: dict[str, Any], metadata: dict[str, Any],
                    *, user: str) -> tuple[int, str]:
        return self.interact({
            "type": "view_submission", "user": {"id": user}, "team": {"id": "T0PREFLIGHT"},
            "api_app_id": "A0APP", "trigger_id": f"trig{next(self._ids)}",
            "view": {"id": "V1", "type": "modal", "callback_id": callback_id,
                     "private_metadata": json.dumps(metadata), "state": {"values": values}}})

    def decide_via_modal(self, run_id: str, decision: str, reason: str, *, user: str,
                         thread_ts: str) -> tuple[int, str]:
        values = {"reason": {"value": {"type": "plain_text_input", "value": reason}}}
        return self.submit_view("preflight_decide", values,
                                {"run": run_id, "decision": decision, "channel": CHANNEL,
                                 "thread_ts": thread_ts}, user=user)

    # -- waiting -----------------------------------------------------------------------
    def wait_status(self, run_id: str, states: tuple[str, ...],
                    timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            run = self.store.get_run(run_id)
            if run["status"] in states:
                return run
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} is {run['status']}, not {states}")
            self.bot.followers.wait(run_id, 0.2)

    def decided(self, run_id: str, timeout: float = 30) -> dict[str, Any]:
        """The run once decided AND its decision message shows the outcome in Slack.

        The state is committed before the message is published, so waiting for the state
        alone (then flushing) can look at the thread a moment too early.
        """
        run = self.wait_status(run_id, ("decided",), timeout)

        def outcome_shown() -> bool:
            ref = self.store.message_ref(run_id, "decision", "slack")
            msg = ref and self.emulator.messages.get((ref["channel"] or CHANNEL, ref["ref"]))
            return bool(msg) and not [b for b in msg.blocks if b["type"] == "actions"]

        assert self.emulator.wait_for(outcome_shown, timeout), "decision never shown"
        assert self.bot.notifier.flush(timeout), "messages still queued"
        return run

    def settle(self, run_id: str, timeout: float = 60) -> dict[str, Any]:
        """The run once its follower has ended and every message has gone out."""
        self.wait_status(run_id, ("awaiting_decision", "decided", "finished", "stopped",
                                    "dispatch_failed"), timeout)
        assert self.bot.followers.wait(run_id, timeout), f"{run_id} still followed"
        assert self.bot.notifier.flush(timeout), "messages still queued"
        return self.store.get_run(run_id)

    def only_run(self) -> dict[str, Any]:
        runs = self.store.list_runs()
        assert len(runs) >= 1, "no run was created"
        return runs[-1]


@pytest.fixture
def make_harness(tmp_path: Path, emulator: SlackEmulator) -> Iterator[Any]:
    made: list[Harness] = []

    def make(dispatcher: Dispatcher, **changes: Any) -> Harness:
        min_interval = changes.pop("min_interval", 1.0)
        policy = changes.pop("policy", None)
        h = Harness(make_settings(tmp_path, emulator, **changes), dispatcher, emulator,
                    min_interval=min_interval, policy=policy)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
