"""The Slack file download sends the bot token only over https to Slack's own hosts (or
to the API endpoint the bot is configured with) and never follows a redirect (issue 32):
urllib carried the ``Authorization`` header on to wherever a redirect pointed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bot.slack.intake import IntakeError, download, download_allowed

TOKEN = "xoxb-secret-token"


@contextmanager
def server(location: str | None, seen: list[dict[str, str]]) -> Iterator[str]:
    """A local HTTP server: redirects every GET to ``location``, or answers a manifest;
    every request's headers go into ``seen``."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(dict(self.headers))
            if location:
                self.send_response(302)
                self.send_header("Location", location)
                self.end_headers()
                return
            body = b"apiVersion: preflight/v1\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def test_a_redirect_is_refused_and_the_token_goes_nowhere_else() -> None:
    elsewhere: list[dict[str, str]] = []
    slack: list[dict[str, str]] = []
    with server(None, elsewhere) as other, server(f"{other}/steal", slack) as api:
        with pytest.raises(IntakeError) as caught:
            download(f"{api}/files/F1/m.yaml", TOKEN, f"{api}/api/")
    assert "redirect (HTTP 302)" in str(caught.value) and "not followed" in str(caught.value)
    assert slack and slack[0]["Authorization"] == f"Bearer {TOKEN}"
    assert elsewhere == []  # never reached, so never given the token


def test_the_configured_endpoint_is_downloaded_from() -> None:
    seen: list[dict[str, str]] = []
    with server(None, seen) as api:
        assert download(f"{api}/files/F1/m.yaml", TOKEN, f"{api}/api/") == \
            "apiVersion: preflight/v1\n"


@pytest.mark.parametrize(("url", "ok"), [
    ("https://files.slack.com/files-pri/T1-F1/m.yaml", True),
    ("https://slack.com/files/m.yaml", True),
    ("http://files.slack.com/files-pri/T1-F1/m.yaml", False),  # plain http: refused
    ("https://files.slack.com.evil.example/m.yaml", False),
    ("https://evil.example/m.yaml", False),
    ("ftp://files.slack.com/m.yaml", False),
    ("http://127.0.0.1:5555/files/F1", True),  # the configured endpoint, as configured
    ("http://127.0.0.1:5556/files/F1", False),  # another port of that host
    ("https://127.0.0.1:5555/files/F1", False),
])
def test_where_the_token_may_go(url: str, ok: bool) -> None:
    assert download_allowed(url, "http://127.0.0.1:5555/api/") is ok
    if not ok:
        with pytest.raises(IntakeError, match="refusing to send the bot token"):
            download(url, TOKEN, "http://127.0.0.1:5555/api/")


def test_without_a_configured_endpoint_only_https_slack_hosts() -> None:
    assert download_allowed("https://files.slack.com/x", "")
    assert not download_allowed("http://127.0.0.1:5555/x", "")
