"""`preflight serve` in Socket Mode, as a real process, against a loopback WebSocket endpoint.

The emulator hands out the endpoint's URL from ``apps.connections.open`` (app-level token
only); the bot connects with slack_sdk's built-in client, receives envelopes, acknowledges
each by its ``envelope_id`` and answers through the Web API emulator.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slack.conftest import CHANNEL, SUBMITTER, TOKEN
from tests.slack.emulator import SlackEmulator
from tests.slack.test_cli import env_for
from tests.slack.websocket import LoopbackSocketMode

APP_TOKEN = "xapp-1-A0APP-1234-socketsecret"


@pytest.fixture
def socket_emulator() -> Iterator[SlackEmulator]:
    with SlackEmulator(tokens=(TOKEN,), app_tokens=(APP_TOKEN,)) as emu:
        yield emu


def serve_socket_mode(tmp_path: Path, emu: SlackEmulator, app_token: str) -> subprocess.Popen[str]:
    env = env_for(tmp_path, SLACK_BOT_TOKEN=TOKEN, SLACK_APP_TOKEN=app_token,
                  SLACK_API_URL=emu.api_url)
    return subprocess.Popen([sys.executable, "-m", "bot", "serve"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def envelope(envelope_id: str, kind: str, payload: dict[str, object]) -> dict[str, object]:
    return {"envelope_id": envelope_id, "type": kind, "payload": payload,
            "accepts_response_payload": kind != "events_api", "retry_attempt": 0,
            "retry_reason": ""}


def test_socket_mode_connects_acknowledges_and_answers(tmp_path: Path,
                                                       socket_emulator: SlackEmulator) -> None:
    emu = socket_emulator
    with LoopbackSocketMode() as ws:
        emu.socket_url = ws.url
        proc = serve_socket_mode(tmp_path, emu, APP_TOKEN)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "connected in Socket Mode" in line, (line, proc.poll())
            assert ws.connected.wait(30) and ws.handshake_path == "/link/?ticket=t-1&app_id=A0APP"
            opened = emu.calls_to("apps.connections.open")
            assert len(opened) == 1
            ts = emu.user_message(CHANNEL, "<@UPREFLIGHTBOT> help", SUBMITTER)
            ws.send(envelope("env-1", "events_api", {
                "type": "event_callback", "team_id": "T0PREFLIGHT", "api_app_id": "A0APP",
                "event_id": "EvSOCKET1", "event_time": int(time.time()),
                "event": {"type": "app_mention", "user": SUBMITTER, "channel": CHANNEL,
                          "ts": ts, "text": "<@UPREFLIGHTBOT> help", "event_ts": ts}}))
            assert ws.ack_for("env-1") == {"envelope_id": "env-1"}
            posted = emu.wait_for(lambda: emu.calls_to("chat.postMessage"))
            assert posted[0].params["thread_ts"] == ts
            assert "/preflight run NAME" in posted[0].params["text"]
            ws.send(envelope("env-2", "slash_commands", {
                "command": "/preflight", "text": "help", "user_id": SUBMITTER,
                "channel_id": CHANNEL, "team_id": "T0PREFLIGHT", "trigger_id": "trig-s",
                "response_url": "http://127.0.0.1:9/unused"}))
            ack = ws.ack_for("env-2")
            assert "/preflight submit" in json.dumps(ack["payload"])
        finally:
            proc.terminate()
            out, err = proc.communicate(timeout=30)
    for secret in (TOKEN, APP_TOKEN, "socketsecret"):
        assert secret not in line + out + err
    assert "Traceback" not in err


def test_refused_app_token_is_one_line_without_the_token(tmp_path: Path,
                                                         socket_emulator: SlackEmulator) -> None:
    wrong = "xapp-1-A0APP-9999-notvalid"
    proc = serve_socket_mode(tmp_path, socket_emulator, wrong)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, err)
    assert err.strip().splitlines() == [err.strip()], err
    assert "SLACK_APP_TOKEN" in err and "invalid_auth" in err
    assert wrong not in out + err and "Traceback" not in err
    assert socket_emulator.calls_to("chat.postMessage") == []
