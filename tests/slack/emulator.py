"""A Slack Web API emulator: a real HTTP server on 127.0.0.1 (port 0) for tests and benches.

It implements the methods the bot uses, rejects what Slack rejects (a bad token, too many
blocks, a section text over 3,000 characters, unknown block types, a message that is too
long, an element Slack does not know, a text input over 3,000 characters, a token of the
wrong type, an edit of someone else's message), answers HTTP 429 with ``Retry-After`` on
demand, serves uploaded files behind the bot token, hands out a Socket Mode URL
(``apps.connections.open``, app-level tokens only) and records every request it received,
file transfers included.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qsl, urlsplit

KNOWN_BLOCKS = frozenset({"section", "header", "context", "actions", "divider", "input",
                          "image", "rich_text", "file", "video"})
BOT_USER = "UPREFLIGHTBOT"
BOT_ID = "BPREFLIGHT"
TEAM = "T0PREFLIGHT"


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    at: float
    status: int = 200
    error: str | None = None


@dataclass
class Posted:
    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    thread_ts: str | None
    user: str = BOT_USER
    edits: int = 0
    history: list[list[dict[str, Any]]] = field(default_factory=list)
    metadata: dict[str, Any] | None = None  # what chat.postMessage's ``metadata`` carried


class SlackApiError(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class SlackEmulator:
    def __init__(self, tokens: tuple[str, ...] = ("xoxb-test-token",),
                 app_tokens: tuple[str, ...] = ()) -> None:
        self.tokens = set(tokens)
        self.app_tokens = set(app_tokens)
        self.socket_url: str | None = None  # what apps.connections.open hands out
        self.not_in_channel: set[str] = set()  # channels the bot was never invited to
        self.responses: list[dict[str, Any]] = []  # what was posted to response_urls
        self.calls: list[Call] = []
        self.messages: dict[tuple[str, str], Posted] = {}
        self.ephemerals: list[dict[str, Any]] = []
        self.views: dict[str, dict[str, Any]] = {}
        self.home: dict[str, dict[str, Any]] = {}
        self.files: dict[str, dict[str, Any]] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self.usergroups: dict[str, list[str]] = {}  # user group id -> member user ids
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._ts = itertools.count(1)
        self._ids = itertools.count(1)
        self._limited: dict[str | None, list[int]] = {}
        self.retry_after = 1
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.api_url = self.url + "/api/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- life cycle -------------------------------------------------------------------
    def __enter__(self) -> SlackEmulator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- test helpers -----------------------------------------------------------------
    def rate_limit(self, count: int, method: str | None = None, retry_after: int = 1) -> None:
        """Answer the next ``count`` calls (of ``method``, or of any method) with HTTP 429."""
        with self._lock:
            self.retry_after = retry_after
            self._limited[method] = [count]

    def add_file(self, name: str, content: bytes, user: str = "U0SUBMITTER") -> dict[str, Any]:
        """A file as if a user had shared it; returns the event's file object."""
        with self._lock:
            fid = f"F{next(self._ids):08d}"
            self.files[fid] = {"id": fid, "name": name, "title": name, "user": user,
                               "content": content, "size": len(content),
                               "url_private_download": f"{self.url}/files/{fid}/{name}"}
            return {k: v for k, v in self.files[fid].items() if k != "content"}

    def user_message(self, channel: str, text: str, user: str,
                     thread_ts: str | None = None) -> str:
        """A message a person posted (a thread root the bot will answer in); its ts."""
        with self._lock:
            ts = self._ts_now()
            self.messages[(channel, ts)] = Posted(channel, ts, text, [], thread_ts, user=user)
            return ts

    def calls_to(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method and c.status == 200
                    and c.error is None]

    def thread(self, channel: str, thread_ts: str) -> list[Posted]:
        with self._lock:
            return sorted((m for m in self.messages.values() if m.channel == channel
                           and (m.ts == thread_ts or m.thread_ts == thread_ts)),
                          key=lambda m: float(m.ts))

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
        """Block until ``predicate()`` is truthy (re-checked on every call received)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._lock.release()
                try:
                    value = predicate()
                finally:
                    self._lock.acquire()
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"condition not met within {timeout} s")
                self._cond.wait(min(left, 0.25))

    # -- the API ----------------------------------------------------------------------
    def handle(self, method: str, params: dict[str, Any],
               token: str | None) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if self._take_rate_limit(method):
                self.calls.append(Call(method, params, time.monotonic(), 429, "ratelimited"))
                self._cond.notify_all()
                return 429, {"ok": False, "error": "ratelimited"}
        try:
            _check_token(token, self.app_tokens if method == "apps.connections.open"
                         else self.tokens, self.tokens | self.app_tokens)
            fn = getattr(self, "api_" + method.replace(".", "_"), None)
            if fn is None:
                raise SlackApiError("unknown_method")
            with self._lock:
                body = {"ok": True, **fn(params)}
            error = None
        except SlackApiError as exc:
            body, error = {"ok": False, "error": exc.error}, exc.error
        with self._lock:
            self.calls.append(Call(method, params, time.monotonic(), 200, error))
            self._cond.notify_all()
        return 200, body

    def _take_rate_limit(self, method: str) -> bool:
        for key in (method, None):
            left = self._limited.get(key)
            if left and left[0] > 0:
                left[0] -= 1
                return True
        return False

    def _ts_now(self) -> str:
        return f"{int(time.time())}.{next(self._ts):06d}"

    def api_auth_test(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"url": "https://preflight-test.slack.com/", "team": "test", "user": "preflight",
                "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID}

    def api_apps_connections_open(self, p: dict[str, Any]) -> dict[str, Any]:
        if self.socket_url is None:
            raise SlackApiError("internal_error")
        return {"url": self.socket_url}

    def _member_of(self, channel: str) -> None:
        if channel in self.not_in_channel:
            raise SlackApiError("not_in_channel")

    def api_chat_postMessage(self, p: dict[str, Any]) -> dict[str, Any]:
        channel = _required(p, "channel")
        self._member_of(channel)
        text, blocks = _check_message(p, max_blocks=50)
        ts = self._ts_now()
        thread_ts = p.get("thread_ts") or None
        if thread_ts and (channel, thread_ts) not in self.messages:
            raise SlackApiError("thread_not_found")
        metadata = _metadata(p)
        self.messages[(channel, ts)] = Posted(channel, ts, text, blocks, thread_ts,
                                              metadata=metadata)
        return {"channel": channel, "ts": ts, "message": {"text": text, "ts": ts}}

    def api_chat_update(self, p: dict[str, Any]) -> dict[str, Any]:
        channel, ts = _required(p, "channel"), _required(p, "ts")
        text, blocks = _check_message(p, max_blocks=50)
        msg = self.messages.get((channel, ts))
        if msg is None:
            raise SlackApiError("message_not_found")
        if msg.user != BOT_USER:
            raise SlackApiError("cant_update_message")
        msg.history.append(msg.blocks)
        msg.text, msg.blocks, msg.edits = text, blocks, msg.edits + 1
        return {"channel": channel, "ts": ts, "text": text}

    def api_chat_postEphemeral(self, p: dict[str, Any]) -> dict[str, Any]:
        channel, user = _required(p, "channel"), _required(p, "user")
        self._member_of(channel)
        text, blocks = _check_message(p, max_blocks=50)
        self.ephemerals.append({"channel": channel, "user": user, "text": text, "blocks": blocks,
                                "thread_ts": p.get("thread_ts")})
        return {"message_ts": self._ts_now()}

    def api_views_open(self, p: dict[str, Any]) -> dict[str, Any]:
        _required(p, "trigger_id")
        view = _check_view(p)
        view_id = f"V{next(self._ids):08d}"
        self.views[view_id] = view
        return {"view": {**view, "id": view_id}}

    def api_views_update(self, p: dict[str, Any]) -> dict[str, Any]:
        view_id = _required(p, "view_id")
        if view_id not in self.views:
            raise SlackApiError("not_found")
        self.views[view_id] = _check_view(p)
        return {"view": {**self.views[view_id], "id": view_id}}

    def api_views_publish(self, p: dict[str, Any]) -> dict[str, Any]:
        user = _required(p, "user_id")
        view = _check_view(p)
        if view.get("type") != "home":
            raise SlackApiError("invalid_arguments")
        self.home[user] = view
        return {"view": {**view, "id": f"VHOME{user}"}}

    def api_files_getUploadURLExternal(self, p: dict[str, Any]) -> dict[str, Any]:
        name = _required(p, "filename")
        length = int(_required(p, "length"))
        fid = f"F{next(self._ids):08d}"
        self.files[fid] = {"id": fid, "name": name, "title": name, "size": length,
                           "content": None, "user": BOT_USER,
                           "url_private_download": f"{self.url}/files/{fid}/{name}"}
        return {"file_id": fid, "upload_url": f"{self.url}/upload/{fid}"}

    def api_files_completeUploadExternal(self, p: dict[str, Any]) -> dict[str, Any]:
        files = _json_param(p, "files")
        out = []
        for f in files:
            stored = self.files.get(f.get("id"))
            if stored is None or stored["content"] is None:
                raise SlackApiError("file_not_found")
            stored["title"] = f.get("title") or stored["name"]
            stored["channel"] = p.get("channel_id")
            stored["thread_ts"] = p.get("thread_ts")
            out.append({k: v for k, v in stored.items() if k != "content"})
        return {"files": out}

    def api_files_info(self, p: dict[str, Any]) -> dict[str, Any]:
        stored = self.files.get(_required(p, "file"))
        if stored is None:
            raise SlackApiError("file_not_found")
        return {"file": {k: v for k, v in stored.items() if k != "content"}}

    def api_conversations_replies(self, p: dict[str, Any]) -> dict[str, Any]:
        channel, ts = _required(p, "channel"), _required(p, "ts")
        msgs = [m for m in self.messages.values() if m.channel == channel
                and (m.ts == ts or m.thread_ts == ts)]
        if not msgs:
            raise SlackApiError("thread_not_found")
        msgs.sort(key=lambda m: float(m.ts))
        # As Slack: metadata only with include_all_metadata; pages of ``limit`` with a cursor.
        with_meta = str(p.get("include_all_metadata", "")).lower() in ("1", "true")
        try:
            limit = max(1, min(1000, int(p.get("limit") or 1000)))
            start = int(p.get("cursor") or 0)
        except ValueError as exc:
            raise SlackApiError("invalid_cursor") from exc
        page = msgs[start:start + limit]
        more = start + limit < len(msgs)
        return {"messages": [{"ts": m.ts, "text": m.text, "user": m.user,
                              "thread_ts": m.thread_ts or m.ts,
                              **({"metadata": m.metadata} if with_meta and m.metadata else {})}
                             for m in page],
                "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""}}

    def api_users_info(self, p: dict[str, Any]) -> dict[str, Any]:
        user = _required(p, "user")
        return {"user": self.users.get(user, {"id": user, "name": user.lower(),
                                              "is_bot": user == BOT_USER})}

    def api_usergroups_users_list(self, p: dict[str, Any]) -> dict[str, Any]:
        group = _required(p, "usergroup")
        if group not in self.usergroups:
            raise SlackApiError("no_such_subteam")
        return {"users": list(self.usergroups[group])}

    # -- raw file transfer ------------------------------------------------------------
    def upload(self, fid: str, data: bytes) -> int:
        with self._lock:
            stored = self.files.get(fid)
            status = 404 if stored is None else 200
            if stored is not None:
                stored["content"] = data
            self.calls.append(Call("file.upload", {"file": fid, "bytes": len(data)},
                                   time.monotonic(), status))
            self._cond.notify_all()
            return status

    def respond(self, key: str, body: bytes) -> int:
        """A POST to a slash command's or a modal's response_url (no token: the URL is it)."""
        with self._lock:
            try:
                payload = json.loads(body)
            except json.JSONDecodeError:
                payload = None
            status = 200 if isinstance(payload, dict) and payload.get("text") else 400
            self.calls.append(Call("response_url", {"key": key, **(payload or {})},
                                   time.monotonic(), status))
            if status == 200:
                self.responses.append({"key": key, **payload})
            self._cond.notify_all()
            return status

    def unknown(self, verb: str, path: str) -> None:
        with self._lock:
            self.calls.append(Call(f"{verb} {path}", {}, time.monotonic(), 404, "not_found"))
            self._cond.notify_all()

    def download(self, fid: str, token: str | None) -> tuple[int, bytes]:
        with self._lock:
            stored = self.files.get(fid)
            if token not in self.tokens:
                status, data = 403, b"not authorised"
            elif stored is None or stored["content"] is None:
                status, data = 404, b"no such file"
            else:
                status, data = 200, stored["content"]
            self.calls.append(Call("file.download", {"file": fid}, time.monotonic(), status))
            self._cond.notify_all()
            return status, data


def _check_token(token: str | None, accepted: set[str], known: set[str]) -> None:
    if token in accepted:
        return
    if not token:
        raise SlackApiError("not_authed")
    raise SlackApiError("not_allowed_token_type" if token in known else "invalid_auth")


def _required(p: dict[str, Any], name: str) -> Any:
    value = p.get(name)
    if value in (None, ""):
        raise SlackApiError("channel_not_found" if name == "channel" else "invalid_arguments")
    return value


def _metadata(p: dict[str, Any]) -> dict[str, Any] | None:
    """chat.postMessage's ``metadata``: an event type and a payload object, as Slack wants."""
    raw = p.get("metadata")
    if raw in (None, ""):
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise SlackApiError("invalid_metadata_format") from exc
    if (not isinstance(raw, dict) or not isinstance(raw.get("event_type"), str)
            or not raw["event_type"] or not isinstance(raw.get("event_payload"), dict)):
        raise SlackApiError("invalid_metadata_schema")
    return {"event_type": raw["event_type"], "event_payload": raw["event_payload"]}


def _json_param(p: dict[str, Any], name: str) -> Any:
    value = p.get(name)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise SlackApiError("invalid_arguments") from exc
    return value


def _check_message(p: dict[str, Any], *, max_blocks: int) -> tuple[str, list[dict[str, Any]]]:
    text = str(p.get("text") or "")
    blocks = _json_param(p, "blocks") or []
    if not text and not blocks:
        raise SlackApiError("no_text")
    if len(text) > 40000:
        raise SlackApiError("msg_too_long")
    _check_blocks(blocks, max_blocks)
    return text, blocks


def _check_view(p: dict[str, Any]) -> dict[str, Any]:
    view = _json_param(p, "view")
    if not isinstance(view, dict) or view.get("type") not in ("modal", "home"):
        raise SlackApiError("invalid_arguments")
    _check_blocks(view.get("blocks") or [], 100)
    if view["type"] == "modal":
        title = (view.get("title") or {}).get("text", "")
        if not title or len(title) > 24:
            raise SlackApiError("invalid_arguments")
    if len(str(view.get("private_metadata") or "")) > 3000:
        raise SlackApiError("invalid_arguments")
    return view


def _check_blocks(blocks: Any, max_blocks: int) -> None:
    if not isinstance(blocks, list) or len(blocks) > max_blocks:
        raise SlackApiError("invalid_blocks")
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in KNOWN_BLOCKS:
            raise SlackApiError("invalid_blocks")
        if kind == "section":
            text = (block.get("text") or {}).get("text", "")
            fields = block.get("fields") or []
            if len(text) > 3000 or len(fields) > 10 or not (text or fields):
                raise SlackApiError("invalid_blocks")
            if any(len(f.get("text", "")) > 2000 for f in fields):
                raise SlackApiError("invalid_blocks")
        elif kind == "header":
            text = (block.get("text") or {}).get("text", "")
            if not text or len(text) > 150 or block["text"].get("type") != "plain_text":
                raise SlackApiError("invalid_blocks")
        elif kind == "actions":
            elements = block.get("elements") or []
            if not elements or len(elements) > 25:
                raise SlackApiError("invalid_blocks")
        elif kind == "context":
            if not block.get("elements") or len(block["elements"]) > 10:
                raise SlackApiError("invalid_blocks")
        elif kind == "input":
            _check_input(block)


INPUT_ELEMENTS = frozenset({"plain_text_input", "file_input", "static_select",
                            "checkboxes", "radio_buttons", "users_select",
                            "conversations_select", "datepicker", "number_input"})


def _check_input(block: dict[str, Any]) -> None:
    """An input block as views.open checks it: a label, a known element, its limits."""
    label = (block.get("label") or {}).get("text", "")
    element = block.get("element") or {}
    if not label or len(label) > 2000 or element.get("type") not in INPUT_ELEMENTS:
        raise SlackApiError("invalid_blocks")
    if len((block.get("hint") or {}).get("text", "")) > 2000:
        raise SlackApiError("invalid_blocks")
    if element["type"] == "plain_text_input":
        low, high = element.get("min_length", 0), element.get("max_length", 3000)
        if not 0 <= low <= 3000 or not 1 <= high <= 3000 or low > high:
            raise SlackApiError("invalid_blocks")
    if element["type"] == "file_input" and not 1 <= element.get("max_files", 10) <= 10:
        raise SlackApiError("invalid_blocks")


def _handler(emu: SlackEmulator) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def _token(self, params: dict[str, Any]) -> str | None:
            auth = self.headers.get("Authorization") or ""
            if auth.startswith("Bearer "):
                return auth[len("Bearer "):]
            token = params.get("token")
            return str(token) if token else None

        def _send(self, status: int, body: bytes, ctype: str = "application/json",
                  extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            parts = urlsplit(self.path).path.strip("/").split("/")
            if len(parts) >= 2 and parts[0] == "files":
                status, data = emu.download(parts[1], self._token({}))
                self._send(status, data, "application/octet-stream")
                return
            if parts and parts[0] == "api" and len(parts) == 2:
                params = dict(parse_qsl(urlsplit(self.path).query))
                self._api(parts[1], params)
                return
            emu.unknown("GET", self.path)
            self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            split = urlsplit(self.path)
            parts = split.path.strip("/").split("/")
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if len(parts) == 2 and parts[0] == "upload":
                self._send(emu.upload(parts[1], _multipart_payload(raw, self.headers)),
                           b"OK - uploaded", "text/plain")
                return
            if len(parts) == 2 and parts[0] == "response":
                self._send(emu.respond(parts[1], raw), b"ok", "text/plain")
                return
            if len(parts) != 2 or parts[0] != "api":
                emu.unknown("POST", self.path)
                self._send(404, b"not found", "text/plain")
                return
            params: dict[str, Any] = dict(parse_qsl(split.query))
            ctype = self.headers.get("Content-Type") or ""
            if "application/json" in ctype and raw:
                params.update(json.loads(raw))
            elif raw:
                params.update(parse_qsl(raw.decode("utf-8"), keep_blank_values=True))
            self._api(parts[1], params)

        def _api(self, method: str, params: dict[str, Any]) -> None:
            status, body = emu.handle(method, params, self._token(params))
            extra = {"Retry-After": str(emu.retry_after)} if status == 429 else None
            self._send(status, json.dumps(body).encode(), extra=extra)

    return Handler


def _multipart_payload(raw: bytes, headers: Any) -> bytes:
    """The file part of a multipart upload (slack_sdk posts the raw bytes or multipart)."""
    ctype = headers.get("Content-Type") or ""
    if "multipart/form-data" not in ctype or "boundary=" not in ctype:
        return raw
    boundary = ctype.split("boundary=", 1)[1].strip('"').encode()
    for part in raw.split(b"--" + boundary):
        if b"\r\n\r\n" in part and b"filename=" in part.split(b"\r\n\r\n", 1)[0]:
            return part.split(b"\r\n\r\n", 1)[1].rsplit(b"\r\n", 1)[0]
    return raw
