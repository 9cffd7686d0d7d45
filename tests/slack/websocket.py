"""A loopback WebSocket server standing in for Slack's Socket Mode endpoint (tests only).

Slack's Socket Mode: the app calls ``apps.connections.open`` with its ``xapp-`` token, gets a
``wss://`` URL, connects, receives ``hello`` and then envelopes (``events_api``,
``slash_commands``, ``interactive``), and acknowledges each one by sending back its
``envelope_id`` (with a ``payload`` for slash commands and view submissions). This server
speaks the part of RFC 6455 slack_sdk's built-in client uses (text frames, ping/pong,
close) over plain TCP on 127.0.0.1: the client uses TLS only on port 443.
"""

from __future__ import annotations

import base64
import hashlib
import json
import queue
import socket
import struct
import threading
from typing import Any

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455


class LoopbackSocketMode:
    def __init__(self, app_id: str = "A0APP") -> None:
        self.app_id = app_id
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"ws://127.0.0.1:{self.server.getsockname()[1]}/link/?ticket=t-1&app_id={app_id}"
        self.received: queue.Queue[dict[str, Any]] = queue.Queue()
        self.connected = threading.Event()
        self.handshake_path: str | None = None
        self._conn: socket.socket | None = None
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ws-loopback", daemon=True)

    def __enter__(self) -> LoopbackSocketMode:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self.server.close()
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
        self._thread.join(5)

    # -- what a test does ---------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        assert self.connected.wait(30), "the bot never connected to the Socket Mode endpoint"
        self._frame(0x1, json.dumps(message).encode())

    def ack_for(self, envelope_id: str, timeout: float = 20.0) -> dict[str, Any]:
        """The bot's acknowledgement of one envelope (other messages are skipped)."""
        while True:
            message = self.received.get(timeout=timeout)
            if message.get("envelope_id") == envelope_id:
                return message

    # -- the server -------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self._conn = conn
            try:
                self._handshake(conn)
                self._frame(0x1, json.dumps({"type": "hello", "num_connections": 1,
                                             "connection_info": {"app_id": self.app_id}}).encode())
                self.connected.set()
                self._read_frames(conn)
            except (OSError, ConnectionError):
                pass
            finally:
                self.connected.clear()
                conn.close()

    def _handshake(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            data += chunk
        head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        self.handshake_path = head[0].split(" ")[1]
        headers = {k.strip().lower(): v.strip() for k, v in
                   (line.split(":", 1) for line in head[1:] if ":" in line)}
        accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + _GUID)
                                  .digest()).decode()
        conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n").encode())

    def _read_frames(self, conn: socket.socket) -> None:
        while True:
            b1, b2 = _read_exact(conn, 2)
            opcode, length = b1 & 0x0F, b2 & 0x7F
            if length == 126:
                length = struct.unpack("!H", _read_exact(conn, 2))[0]
            elif length == 127:
                length = struct.unpack("!Q", _read_exact(conn, 8))[0]
            mask = _read_exact(conn, 4) if b2 & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(_read_exact(conn, length)))
            if opcode == 0x1:
                self.received.put(json.loads(payload))
            elif opcode == 0x9:
                self._frame(0xA, payload)
            elif opcode == 0x8:
                return

    def _frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
        conn = self._conn
        assert conn is not None
        with self._send_lock:
            conn.sendall(head + payload)


def _read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the client closed the connection")
        data += chunk
    return data
