"""HTTP mode: bolt's ASGI adapter under uvicorn, each request dispatched on a worker thread.

bolt's built-in ASGI handler calls the (synchronous) App on the event loop, so one slow
request would hold up every other one; here ``App.dispatch`` runs in a thread, and the
loop only reads bodies and writes responses. ``POST /slack/events`` takes events,
interactivity and slash commands; ``GET /healthz`` answers ``ok`` for load balancers.

The body is read before bolt can check its signature, so anyone who reaches the port can
send one: a body over ``max_body`` bytes (declared in Content-Length, or streamed) is
answered 413 as soon as the cap is passed, without reading the rest or parsing anything.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import uvicorn
from slack_bolt import App, BoltResponse
from slack_bolt.adapter.asgi import SlackRequestHandler
from slack_bolt.adapter.asgi.http_request import AsgiHttpRequest
from slack_bolt.adapter.asgi.http_response import AsgiHttpResponse
from slack_bolt.request import BoltRequest

EVENTS_PATH = "/slack/events"
MAX_BODY = 1024 * 1024  # Slack's own payloads are a few KiB; settings.http_max_body


class BodyTooLarge(Exception):
    """The request's body passed the cap; nothing of it is parsed."""


class ThreadedSlackHandler(SlackRequestHandler):
    """bolt's ASGI adapter with the synchronous dispatch moved off the event loop."""

    def __init__(self, app: App, path: str = EVENTS_PATH, max_body: int = MAX_BODY) -> None:
        super().__init__(app, path)
        self.max_body = max_body

    async def dispatch(self, request: AsgiHttpRequest) -> BoltResponse:
        try:
            body = await self._capped_body(request)
        except BodyTooLarge:
            return BoltResponse(status=413, body=f"request body over {self.max_body} bytes",
                                headers={"content-type": "text/plain", "connection": "close"})
        bolt_request = BoltRequest(body=body.decode("utf-8", "replace"),
                                   query=request.query_string, headers=request.get_headers())
        return await asyncio.to_thread(self.app.dispatch, bolt_request)

    async def _capped_body(self, request: AsgiHttpRequest) -> bytes:
        """The body, read chunk by chunk; BodyTooLarge once it (or what its Content-Length
        announces) passes ``max_body``, with the rest left unread."""
        for name, value in request.raw_headers:
            if name.lower() == b"content-length" and (
                    not value.strip().isdigit() or int(value) > self.max_body):
                raise BodyTooLarge
        chunks = bytearray()
        while True:
            message = await request.receive()
            if message["type"] != "http.request":  # the client went away
                raise BodyTooLarge
            chunks += message.get("body", b"")
            if len(chunks) > self.max_body:
                raise BodyTooLarge
            if not message.get("more_body", False):
                return bytes(chunks)

    async def _get_http_response(self, method: str, path: str,
                                 request: AsgiHttpRequest) -> AsgiHttpResponse:
        if method == "GET" and path == "/healthz":
            return AsgiHttpResponse(status=200, headers={"content-type": ["text/plain"]}, body="ok")
        response: AsgiHttpResponse = await super()._get_http_response(method, path, request)
        return response


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound, listening socket: connections queue from now on, even before uvicorn runs."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class HttpServer:
    """uvicorn serving a bolt App; ``start()`` runs it on a thread (tests, benches)."""

    def __init__(self, app: App, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning", max_body: int = MAX_BODY) -> None:
        self.sock = listening_socket(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        config = uvicorn.Config(ThreadedSlackHandler(app, max_body=max_body),
                                log_level=log_level, lifespan="off",
                                access_log=False, timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{EVENTS_PATH}"

    def serve(self) -> None:
        """Serve in this thread until interrupted (the production entry point)."""
        self.server.run(sockets=[self.sock])

    def start(self) -> HttpServer:
        self._thread = threading.Thread(target=self.serve, name="slack-http", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> HttpServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
