"""SlackNotifier: one visible Slack message per (run, key), updated in place.

A key's first message is posted at once, in the caller's thread, so the thread reads in
the order the service published. Posting survives a crash without doubling: the intent is
recorded before ``chat.postMessage``, each post carries message metadata naming its run and
key, and the ``ts`` is stored right after. A bot that died between the post and storing
its ``ts`` finds the intent on restart and looks the thread up (``conversations.replies``
with the metadata) before posting: a message already there is adopted and edited, never
posted again. Later states of the same key are coalesced: a background flusher sends at
most one ``chat.update`` per ``min_interval`` seconds per message, always the latest state;
the time of each send is stored, so a restarted bot keeps the pace (a message known from
before without a recorded time waits one interval). Rate limits (HTTP 429) are honoured by
slack_sdk's retry handler; a send that still fails is kept and retried.
"""

from __future__ import annotations

import gzip
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from bot.errors import PreflightError
from bot.manifest.secrets import classify_value, redact_secrets
from bot.messages.model import Attachment, Message
from bot.pilot.record import RunRecord
from bot.slack.blocks import Rendered, render

log = logging.getLogger(__name__)

TRANSPORT = "slack"
RETRY_DELAY = 2.0
MAX_UPLOAD_BYTES = 64 << 20  # the most the bot uploads as one file (balance.csv, report)
MAX_READ_BYTES = 256 << 20  # the most of a file the bot reads to compress it under that
GZIP_OVER = 1 << 20  # a text table (.csv, .jsonl) over this goes as NAME.gz (balance.csv.gz)
GZIP_SUFFIXES = (".csv", ".jsonl", ".tsv")
EVENT_TYPE = "preflight_message"  # the metadata event type of every message the bot posts
Fault = Callable[[str, Message], None]  # a test's hook: called at named points of a send


class MessageRefs(Protocol):
    """What the notifier keeps of each message: where it was posted (its ``ts`` and
    channel), the intent noted before a post, and when it was last sent. The bot's store
    is one; the notifier reads the run (its channel and thread) from it too."""

    def run_record(self, run_id: str) -> RunRecord: ...
    def message_ref(self, run_id: str, key: str, transport: str) -> dict[str, Any] | None: ...
    def set_message_ref(self, run_id: str, key: str, transport: str, ref: str,
                        channel: str | None = None) -> None: ...
    def record_post_intent(self, run_id: str, key: str) -> bool: ...
    def record_sent(self, run_id: str, key: str, at: float) -> None: ...
    def last_sent(self, run_id: str, key: str) -> float | None: ...


@dataclass
class _Slot:
    """Delivery state of one visible message."""

    lock: threading.Lock
    pending: Message | None = None
    due: float = 0.0
    last_sent: float = float("-inf")
    in_flight: bool = False


class SlackNotifier:
    def __init__(self, client: WebClient, store: MessageRefs, *, min_interval: float = 1.0,
                 fault: Fault | None = None) -> None:
        self.client = client
        self.store = store
        self.min_interval = min_interval
        self.fault = fault  # tests: "posted" fires between chat.postMessage and storing the ts
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._busy = 0  # publish() calls posting right now, in their callers' threads
        self._thread = threading.Thread(target=self._flush_loop, name="slack-flusher", daemon=True)
        self._thread.start()

    # -- the Notifier protocol ----------------------------------------------------
    def publish(self, message: Message) -> None:
        with self._cond:
            self._busy += 1
        try:
            self._publish(message)
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def _publish(self, message: Message) -> None:
        run = self.store.run_record(message.run_id)
        if not run.channel:
            return  # a run started from the terminal has no Slack thread
        slot = self._slot(message.run_id, message.key)
        with slot.lock:
            if self.store.message_ref(message.run_id, message.key, TRANSPORT) is None:
                if self._post(run, message):
                    slot.last_sent = time.monotonic()
                    return
                self._queue(slot, message, time.monotonic() + RETRY_DELAY)
                return
        self._queue(slot, message, slot.last_sent + self.min_interval)

    # -- life cycle -----------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued state has been delivered (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._busy or any(s.pending is not None or s.in_flight
                                    for s in self._slots.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
        return True

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # -- internals ------------------------------------------------------------------
    def _slot(self, run_id: str, key: str) -> _Slot:
        with self._cond:
            slot = self._slots.get((run_id, key))
            if slot is None:
                slot = self._slots[(run_id, key)] = _Slot(threading.Lock(),
                                                          last_sent=self._sent_before(run_id, key))
            return slot

    def _sent_before(self, run_id: str, key: str) -> float:
        """The last send of a message by an earlier bot, on this process's monotonic clock."""
        at = self.store.last_sent(run_id, key)
        if at is not None:
            return time.monotonic() - max(0.0, time.time() - at)
        if self.store.message_ref(run_id, key, TRANSPORT) is not None:
            return time.monotonic()  # sent at an unknown time: wait one interval
        return float("-inf")

    def _queue(self, slot: _Slot, message: Message, due: float) -> None:
        with self._cond:
            slot.pending = message
            slot.due = max(due, time.monotonic()) if not slot.in_flight else slot.due
            self._cond.notify_all()

    def _flush_loop(self) -> None:
        while True:
            with self._cond:
                slot, message = self._next_due()
                while slot is None or message is None:
                    if self._closed:
                        return
                    wait = self._next_wait()
                    self._cond.wait(wait)
                    slot, message = self._next_due()
                slot.pending = None
                slot.in_flight = True
            try:
                delivered = self._deliver(slot, message)
            except Exception:  # the flusher must survive anything a send raises
                log.exception("delivering %s of run %s failed", message.key, message.run_id)
                delivered = False
            with self._cond:
                slot.in_flight = False
                if delivered:
                    slot.last_sent = time.monotonic()
                    slot.due = slot.last_sent + self.min_interval
                elif slot.pending is None:
                    slot.pending = message  # the last state is never dropped
                    slot.due = time.monotonic() + RETRY_DELAY
                else:
                    slot.due = max(slot.due, time.monotonic() + RETRY_DELAY)
                self._cond.notify_all()

    def _next_due(self) -> tuple[_Slot | None, Message | None]:
        now = time.monotonic()
        for slot in self._slots.values():
            if slot.pending is not None and not slot.in_flight:
                due = max(slot.due, slot.last_sent + self.min_interval)
                if due <= now:
                    return slot, slot.pending
        return None, None

    def _next_wait(self) -> float | None:
        dues = [max(s.due, s.last_sent + self.min_interval) for s in self._slots.values()
                if s.pending is not None and not s.in_flight]
        if not dues:
            return None
        return max(0.0, min(dues) - time.monotonic())

    def _deliver(self, slot: _Slot, message: Message) -> bool:
        run = self.store.run_record(message.run_id)
        with slot.lock:
            if self.store.message_ref(message.run_id, message.key, TRANSPORT) is None:
                return self._post(run, message)
            return self._update(run, message)

    def _post(self, run: RunRecord, message: Message) -> bool:
        rendered = render(message)
        channel, thread_ts = self._thread_of(run)
        first = self.store.record_post_intent(run.id, message.key)
        try:
            if not first and thread_ts is not None:
                found = self._find_posted(channel, thread_ts, run.id, message.key)
                if found is not None:  # posted by a bot that died before storing its ts
                    self.store.set_message_ref(run.id, message.key, TRANSPORT, found, channel)
                    return self._update(run, message)
            resp = self.client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=rendered.text, blocks=rendered.blocks,
                metadata={"event_type": EVENT_TYPE,
                          "event_payload": {"run": run.id, "key": message.key}})
        except (SlackApiError, SlackClientError) as exc:
            log.warning("posting %s of run %s failed: %s", message.key, run.id, _why(exc))
            return False
        if self.fault is not None:
            self.fault("posted", message)
        ts = str(resp["ts"])
        self.store.set_message_ref(run.id, message.key, TRANSPORT, ts, str(resp["channel"]))
        self.store.record_sent(run.id, message.key, time.time())
        if thread_ts is None:
            self.store.set_message_ref(run.id, "thread", TRANSPORT, ts, str(resp["channel"]))
        self._upload(run, rendered)
        return True

    def _update(self, run: RunRecord, message: Message) -> bool:
        ref = self.store.message_ref(run.id, message.key, TRANSPORT)
        assert ref is not None
        rendered = render(message)
        try:
            self.client.chat_update(channel=str(ref["channel"] or run.channel), ts=ref["ref"],
                                    text=rendered.text, blocks=rendered.blocks)
        except (SlackApiError, SlackClientError) as exc:
            log.warning("updating %s of run %s failed: %s", message.key, run.id, _why(exc))
            return False
        self.store.record_sent(run.id, message.key, time.time())
        self._upload(run, rendered)
        return True

    def _find_posted(self, channel: str, thread_ts: str, run_id: str, key: str) -> str | None:
        """The ts of this run's ``key`` message already in the thread, by its metadata."""
        cursor: str | None = None
        while True:
            resp = self.client.conversations_replies(channel=channel, ts=thread_ts, limit=200,
                                                     include_all_metadata=True, cursor=cursor)
            for msg in resp.get("messages") or []:
                meta = msg.get("metadata") or {}
                payload = meta.get("event_payload") or {}
                if (meta.get("event_type") == EVENT_TYPE and payload.get("run") == run_id
                        and payload.get("key") == key):
                    return str(msg["ts"])
            cursor = (resp.get("response_metadata") or {}).get("next_cursor") or None
            if not resp.get("has_more") or not cursor:
                return None

    def _upload(self, run: RunRecord, rendered: Rendered) -> None:
        for attachment in rendered.attachments:
            self._upload_once(run, attachment)

    def _upload_once(self, run: RunRecord, attachment: Attachment) -> None:
        key = f"file:{attachment.title}"
        if self.store.message_ref(run.id, key, TRANSPORT) is not None:
            return
        channel, thread_ts = self._thread_of(run)
        try:
            data, name = attachable(run, attachment)
        except NotAttached as exc:
            self._say_not_attached(run, attachment, exc, channel, thread_ts)
            return
        except PreflightError as exc:
            log.warning("not uploading %s of run %s: %s", attachment.title, run.id, exc)
            return
        try:
            resp = self.client.files_upload_v2(channel=channel, thread_ts=thread_ts,
                                               file=data, filename=name, title=name)
        except (SlackApiError, SlackClientError, OSError) as exc:
            log.warning("uploading %s of run %s failed: %s", attachment.title, run.id, _why(exc))
            return
        file_id = str((resp.get("file") or {}).get("id", "uploaded"))
        self.store.set_message_ref(run.id, key, TRANSPORT, file_id, channel)

    def _say_not_attached(self, run: RunRecord, attachment: Attachment, exc: NotAttached,
                          channel: str, thread_ts: str | None) -> None:
        """One message in the thread: which file, its size, the limit, where it lies on
        the bot host (recorded under the file's key, so it is said once)."""
        log.warning("not uploading %s of run %s: %s", attachment.title, run.id, exc)
        text = (f":warning: {attachment.title} is not attached: {exc.why}. It lies on the "
                f"bot host at {attachment.path}.")
        try:
            resp = self.client.chat_postMessage(
                channel=channel, thread_ts=thread_ts, text=redact_secrets(text),
                metadata={"event_type": EVENT_TYPE,
                          "event_payload": {"run": run.id, "key": f"file:{attachment.title}"}})
        except (SlackApiError, SlackClientError) as err:
            log.warning("saying %s of run %s is not attached failed: %s", attachment.title,
                        run.id, _why(err))
            return
        self.store.set_message_ref(run.id, f"file:{attachment.title}", TRANSPORT,
                                   f"not-attached:{resp['ts']}", channel)

    def _thread_of(self, run: RunRecord) -> tuple[str, str | None]:
        if run.thread_ts:
            return str(run.channel), str(run.thread_ts)
        root = self.store.message_ref(run.id, "thread", TRANSPORT)
        return str(run.channel), (str(root["ref"]) if root else None)


class NotAttached(PreflightError):
    """A file the bot will not upload because of its size (``why`` says size and limit)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.why = why


def attachable(run: RunRecord, attachment: Attachment) -> tuple[bytes, str]:
    """The bytes the bot may upload for ``attachment`` and the file name to give them: a
    regular file inside the run's directory (its folder resolved and compared, the file
    itself opened with ``O_NOFOLLOW``: a link is refused, never followed), with every
    credential-looking value redacted (``redact_secrets``; a binary file that holds one is
    refused whole). A text table over ``GZIP_OVER`` goes gzip-compressed as ``NAME.gz``
    (a million-row balance.csv: ~53 MiB, a few MiB compressed). What is sent is at most
    ``MAX_UPLOAD_BYTES``; a larger one raises ``NotAttached`` (the thread is told). A run's
    files are written by the team's code: a file name the bot chose says nothing of what
    is in it (docs/security.md)."""
    run_dir = Path(run.run_dir).resolve()
    given = Path(attachment.path)
    path = given.parent.resolve() / given.name
    if run_dir not in path.parents:
        raise PreflightError(f"{attachment.path}: not inside the run directory {run_dir}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise PreflightError(f"{path}: cannot be attached ({exc.strerror}; a symbolic link "
                             "is never followed)") from exc
    gzipped = attachment.title.endswith(GZIP_SUFFIXES)
    limit = MAX_READ_BYTES if gzipped else MAX_UPLOAD_BYTES
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise PreflightError(f"{path}: not a regular file, not attached")
        if info.st_size > limit:
            raise NotAttached(path, f"{_size(info.st_size)}, over the {_size(limit)} the bot "
                                    f"{'reads to compress' if gzipped else 'uploads'}")
        data = fh.read(limit + 1)[:limit]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        what = classify_value(data.decode("latin-1"))
        if what is not None:
            raise PreflightError(f"{path}: a binary file that holds what looks like {what}: "
                                 "not attached") from None
        return _within_limit(path, data, attachment.title)
    data = redact_secrets(text).encode("utf-8")
    if gzipped and len(data) > GZIP_OVER:
        return _within_limit(path, gzip.compress(data, compresslevel=6, mtime=0),
                             attachment.title + ".gz", len(data))
    return _within_limit(path, data, attachment.title)


def _within_limit(path: Path, data: bytes, name: str, raw: int | None = None
                  ) -> tuple[bytes, str]:
    if len(data) > MAX_UPLOAD_BYTES:
        was = f" ({_size(raw)} before compression)" if raw is not None else ""
        raise NotAttached(path, f"{_size(len(data))}{was} as {name}, over the "
                                f"{_size(MAX_UPLOAD_BYTES)} the bot uploads")
    return data, name


def _size(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB" if count >= 1 << 20 else f"{count} bytes"


def _why(exc: Exception) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error", exc.response.status_code))
    return type(exc).__name__ if isinstance(exc, PreflightError) else str(exc)
