"""HTTP mode under attack: a body over the cap is refused before it is read whole or parsed,
and the server listens on loopback unless told otherwise (issue 24, item 6)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from slack_bolt import App, BoltResponse
from slack_bolt.request import BoltRequest
from slack_sdk import WebClient
from slack_sdk.signature import SignatureVerifier

from bot.settings import Settings
from bot.slack.server import MAX_BODY, HttpServer
from tests.slack.conftest import SECRET, TOKEN
from tests.slack.emulator import SlackEmulator

CAP = 4096


class CountingApp(App):
    """A bolt App that remembers every request that reached it."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.seen: list[BoltRequest] = []

    def dispatch(self, req: BoltRequest) -> BoltResponse:
        self.seen.append(req)
        return super().dispatch(req)


@pytest.fixture
def server(emulator: SlackEmulator) -> Iterator[tuple[HttpServer, CountingApp]]:
    app = CountingApp(token=TOKEN, signing_secret=SECRET, token_verification_enabled=False,
                      client=WebClient(token=TOKEN, base_url=emulator.api_url))
    with HttpServer(app, port=0, max_body=CAP) as http:
        yield http, app


def signed(body: str) -> dict[str, str]:
    ts = str(int(time.time()))
    return {"Content-Type": "application/json", "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": SignatureVerifier(SECRET).generate_signature(
                timestamp=ts, body=body)}


def exchange(http: HttpServer, head: dict[str, str], parts: Iterator[bytes]) -> bytes:
    """Send the request head, then body parts while the server has not answered; return
    the answer's status line and headers."""
    with socket.create_connection((http.host, http.port), timeout=30) as conn:
        lines = ["POST /slack/events HTTP/1.1", f"Host: {http.host}"]
        lines += [f"{k}: {v}" for k, v in head.items()]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        conn.setblocking(False)
        answer = b""
        for part in parts:
            try:
                answer += conn.recv(65536)
            except BlockingIOError:
                pass
            if answer:
                break
            try:
                conn.sendall(part)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                break  # the server stopped reading: its answer is on the way
        conn.setblocking(True)
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer.split(b"\r\n\r\n", 1)[0]


def endless(size: int, *, chunked: bool = False) -> Iterator[bytes]:
    """Body parts that go on for as long as the client is willing to send (bounded here
    at 64 times the cap so that a server that reads everything ends the test)."""
    for _ in range(64 * CAP // size):
        data = b"x" * size
        yield (f"{size:x}\r\n".encode() + data + b"\r\n") if chunked else data


def test_a_body_announced_over_the_cap_is_refused_unread(
        server: tuple[HttpServer, CountingApp]) -> None:
    http, app = server
    head = {**signed("x"), "Content-Length": str(64 * CAP)}
    answer = exchange(http, head, endless(CAP // 4))
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert app.seen == []


def test_a_streamed_body_over_the_cap_is_refused_before_its_end(
        server: tuple[HttpServer, CountingApp]) -> None:
    http, app = server
    head = {**signed("x"), "Transfer-Encoding": "chunked"}
    answer = exchange(http, head, endless(CAP // 4, chunked=True))  # never a last chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert app.seen == []


def test_a_signed_body_under_the_cap_is_still_served(
        server: tuple[HttpServer, CountingApp]) -> None:
    http, app = server
    body = json.dumps({"type": "url_verification", "challenge": "c" * (CAP - 200), "token": "x"})
    head = {**signed(body), "Content-Length": str(len(body))}
    answer = exchange(http, head, iter([body.encode()]))
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert len(app.seen) == 1


def test_the_defaults_are_loopback_and_one_mib() -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": "/nonexistent"})
    assert settings.http_host == "127.0.0.1"
    assert settings.http_max_body == MAX_BODY == 1024 * 1024
    custom = Settings.from_env({"PREFLIGHT_HOME": "/nonexistent",
                                "PREFLIGHT_HTTP_HOST": "10.0.0.5",
                                "PREFLIGHT_HTTP_MAX_BODY": "2048"})
    assert (custom.http_host, custom.http_max_body) == ("10.0.0.5", 2048)
