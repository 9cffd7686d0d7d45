"""The event protocol between runner and bot: one JSON object per line.

This module is part of the contract the bot imports, so it stays standard-library only and
forward compatible: readers ignore unknown event types and unknown fields. Two parts of
it live apart and are re-exported here, so a reader imports ``runner.events`` alone: the
capping of long lists (``runner/event_lists.py``) and the windowed reader of an events
file (``runner/event_window.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import IO, Any, Dict, List, Optional, Tuple

from runner.errors import RunnerError
from runner.event_lists import LIST_CAP as LIST_CAP  # re-exported: part of the contract
from runner.event_lists import LISTS_DIR as LISTS_DIR
from runner.event_lists import cap_lists as cap_lists
from runner.event_lists import json_line as _line
from runner.event_lists import list_total as list_total
from runner.event_window import READ_WINDOW as READ_WINDOW
from runner.event_window import READ_WINDOW_MAX as READ_WINDOW_MAX
from runner.event_window import read_complete as read_complete

RUN_STARTED = "run.started"
STAGE_STARTED = "stage.started"
STAGE_PASSED = "stage.passed"
STAGE_FAILED = "stage.failed"
STAGE_SKIPPED = "stage.skipped"
ITEM_DONE = "item.done"
# The runner writes its item.done events in batches: one line holds several, each with its
# own seq and ts (``ITEM_FIELDS`` per item, in that order). ``expand_items`` gives them back
# as item.done events; a reader that records them in bulk (the bot) takes the rows as they
# are, without one event object per item.
ITEM_BATCH = "item.batch"
ITEM_FIELDS = ("seq", "ts", "id", "status", "category", "reason", "elapsed_s",
               "input_bytes", "extra")
_ITEM_KEYS = frozenset(ITEM_FIELDS[2:-1])
PROGRESS = "progress"
BALANCE = "balance"
EVIDENCE = "evidence"
# a long evidence copy says where it is, at most once a minute (`at`): the bot's stall
# watch sees the run move; readers that do not know it ignore it
EVIDENCE_PROGRESS = "evidence.progress"
RUN_FINISHED = "run.finished"
# The volume's engine (runner.volume): what happened to its workers and batches.
VOLUME_WORKERS = "volume.workers"          # the workers started: worker, node, cards
VOLUME_WORKER_LOST = "volume.worker_lost"  # a worker died; its batch is re-queued
VOLUME_NODE_LOST = "volume.node_lost"      # a node left the cluster with its workers
VOLUME_REQUEUED = "volume.requeued"        # a batch handed out again, and why
VOLUME_CARD_EXCLUDED = "volume.card_excluded"  # a worker gets no more batches, and why
VOLUME_LATE = "volume.late_result"         # a re-queued batch's first result came back
# Written by the bot, not the runner: how the dispatch of a several-node volume goes, node
# by node (``node``, ``index``, ``phase``: uploaded, proved, ray_up, launching), before the
# runner writes its first line. The bot keeps these apart from the runner's numbered events.
DISPATCH_NODE = "dispatch.node"
VOLUME_SPLIT = "volume.split"              # a failed batch split, or its one input refused
VOLUME_WORKER_STARTED = "volume.worker_started"  # a worker started in place of one stopped
VOLUME_LIMIT = "volume.limit"              # the time limit widened from the measured rate

STAGES: Tuple[str, ...] = (
    "prepare",
    "interpreter",
    "environment",
    "torch",
    "device",
    "compute",
    "interconnect",
    "extensions",
    "memory",
    "pilot",
    "collect",
    "balance",
    "calibrate",
    "evidence",
)
# Stages only some runs have (runner/stage.py, ``StageDef.needs``): no line until they start.
OPTIONAL_STAGES: Tuple[str, ...] = ("collect", "calibrate")

STAGE_EVENT_TYPES = (STAGE_STARTED, STAGE_PASSED, STAGE_FAILED, STAGE_SKIPPED)
# Stages that run even after a failure (the evidence of a failed run is copied too): they
# do not move a failed run's "stage reached".
AFTER_FAILURE_STAGES = ("evidence",)
COMMON_FIELDS = ("seq", "type", "run", "ts")


def utc_now() -> str:
    """UTC ISO-8601 timestamp with microseconds, the form every event carries."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class Event:
    seq: int
    type: str
    run: str
    ts: str
    data: Dict[str, Any] = field(default_factory=dict)

    def to_line(self) -> str:
        return _line({"seq": self.seq, "type": self.type, "run": self.run, "ts": self.ts,
                      **self.data})

    def to_dict(self) -> Dict[str, Any]:
        return {"seq": self.seq, "type": self.type, "run": self.run, "ts": self.ts, **self.data}

    @property
    def stage(self) -> Optional[str]:
        value = self.data.get("stage")
        return value if isinstance(value, str) else None


class EventFormatError(RunnerError, ValueError):
    """A line of events.jsonl that is not a valid event (names the line)."""


def item_record(seq: int, ts: str, data: Dict[str, Any]) -> List[Any]:
    """One item.done event as an ``item.batch`` entry (``ITEM_FIELDS``); the fields other
    than the usual ones (a handler's ``output``, ``replayed``) go to ``extra``."""
    extra = None
    if not data.keys() <= _ITEM_KEYS:
        extra = {k: v for k, v in data.items() if k not in _ITEM_KEYS}
    get = data.get
    return [seq, ts, get("id"), get("status"), get("category"), get("reason"),
            get("elapsed_s"), get("input_bytes"), extra]


def batch_items(event: Event) -> List[List[Any]]:
    """The entries of an ``item.batch`` event, checked: each a list of ``ITEM_FIELDS``
    with an integer seq above the one before it (the last is the line's seq), a string ts,
    ``extra`` an object or null. Raises EventFormatError naming the batch (by its seq)."""
    items = event.data.get("items")
    where = f"item.batch seq {event.seq}"
    if event.data.get("fields") != list(ITEM_FIELDS) or not isinstance(items, list) \
            or not items:
        raise EventFormatError(f"{where}: expected fields {list(ITEM_FIELDS)} and a "
                               f"non-empty list of items")
    width, prev = len(ITEM_FIELDS), 0
    for n, item in enumerate(items):
        if not (type(item) is list and len(item) == width and type(item[0]) is int
                and item[0] > prev and type(item[1]) is str
                and (item[8] is None or type(item[8]) is dict)):
            raise EventFormatError(f"{where}: item {n} is not [{', '.join(ITEM_FIELDS)}] "
                                   f"with seqs in order: {item!r:.120}")
        prev = item[0]
    if prev != event.seq:
        raise EventFormatError(f"{where}: its last item has seq {prev}, not the line's")
    return items


def expand_items(events: List[Event]) -> List[Event]:
    """``events`` with each ``item.batch`` replaced by its item.done events, in seq order."""
    if not any(e.type == ITEM_BATCH for e in events):
        return events
    out: List[Event] = []
    for event in events:
        if event.type != ITEM_BATCH:
            out.append(event)
            continue
        out.extend(item_event(event.run, *entry) for entry in batch_items(event))
    return out


def item_event(run: str, seq: int, ts: str, iid: Any, status: Any, category: Any, reason: Any,
               elapsed: Any, size: Any, extra: Optional[Dict[str, Any]]) -> Event:
    """The item.done event of an ``item.batch`` entry's fields (``ITEM_FIELDS``); a field
    that is None is left out, as the runner emitted it."""
    data: Dict[str, Any] = {"id": iid, "status": status}
    for key, value in (("category", category), ("reason", reason), ("elapsed_s", elapsed),
                       ("input_bytes", size)):
        if value is not None:
            data[key] = value
    if extra:
        data.update(extra)
    return Event(seq=seq, type=ITEM_DONE, run=run, ts=ts, data=data)


def parse_line(line: str, *, lineno: Optional[int] = None) -> Event:
    """Parse one line; raise EventFormatError naming the line when it is not an event."""
    where = f"line {lineno}: " if lineno is not None else ""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise EventFormatError(f"{where}not JSON ({exc.msg})") from exc
    return _event(obj, where)


def _event(obj: Any, where: str = "") -> Event:
    if not isinstance(obj, dict):
        raise EventFormatError(f"{where}not a JSON object")
    try:
        seq, etype, run, ts = obj["seq"], obj["type"], obj["run"], obj["ts"]
    except KeyError as exc:
        raise EventFormatError(f"{where}missing field {exc.args[0]!r}") from exc
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise EventFormatError(f"{where}seq must be a positive integer, got {seq!r}")
    if not isinstance(etype, str) or not isinstance(run, str) or not isinstance(ts, str):
        raise EventFormatError(f"{where}type, run and ts must be strings")
    # ``obj`` was just parsed and is ours: what is left of it once the common fields are
    # taken out is the event's data (no copy: a follower pays this per item).
    del obj["seq"], obj["type"], obj["run"], obj["ts"]
    return Event(seq=seq, type=etype, run=run, ts=ts, data=obj)


def read_events(path: str, offset: int = 0, *,
                expand: bool = True) -> Tuple[List[Event], int]:
    """Read the complete lines of an events file from a byte offset.

    Returns the events and the offset just past the last complete line, so a caller that
    stores the offset can resume exactly where it stopped; a partial last line (a writer
    mid-append) is left for the next call. ``expand=False`` leaves each ``item.batch`` as
    it was written (see ``expand_items``).
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
    except FileNotFoundError:
        return [], offset
    return parse_chunk(chunk, offset, expand=expand)


def parse_chunk(chunk: bytes, offset: int, *,
                expand: bool = True) -> Tuple[List[Event], int]:
    """Parse the complete lines of ``chunk`` (bytes read from ``offset``); ``expand`` as
    in ``read_events``."""
    end = chunk.rfind(b"\n")
    if end < 0:
        return [], offset
    lines = [raw for raw in chunk[: end + 1].splitlines() if raw.strip()]
    try:  # one decode for the whole chunk: a follower's cost per event stays small
        objs = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        objs = None
    if not isinstance(objs, list) or len(objs) != len(lines):  # name the bad line
        events = [parse_line(raw.decode("utf-8")) for raw in lines]
    else:
        events = [_event(obj) for obj in objs]
    return (expand_items(events) if expand else events), offset + end + 1


class EventWriter:
    """Numbers events, appends each to events.jsonl (flushed) and then echoes it.

    Every list in an event is capped at ``LIST_CAP`` entries (``cap_lists``: the full list
    goes to a file of the run directory, which the event names).

    ``item.done`` events are held and written as one ``item.batch`` line just before the
    next other event (the batch's ``progress``), or once ``max_items`` are held, or at
    ``close``: a fast handler does not pay one line per item, nor a follower one decode
    per item. Each keeps its own seq and ts; the line's seq and ts are its last item's.

    Durable before visible: the line reaches the file before the stream. ``fsync`` is
    forced at stage boundaries and on run events; item events are flushed, and synced
    every ``sync_every`` events but at most once every ``sync_interval_s`` seconds, which
    keeps a million-item volume (and a 1 ms handler) fast; the ledger is the durable record
    of the items, and a resume replays an item event the file lost.
    """

    SYNC_TYPES = frozenset({RUN_STARTED, RUN_FINISHED, STAGE_PASSED, STAGE_FAILED,
                            STAGE_SKIPPED, BALANCE, EVIDENCE})

    def __init__(self, path: str, run: str, *, echo: Optional[IO[str]] = None,
                 start_seq: int = 0, sync_every: int = 256,
                 sync_interval_s: float = 1.0, max_items: int = 256) -> None:
        self.path = path
        self.run = run
        self._run_dir = os.path.dirname(os.path.abspath(path))
        self.seq = start_seq
        self._echo = echo
        self._fh = open(path, "a", encoding="utf-8")
        self._since_sync = 0
        self._sync_every = sync_every
        self._sync_interval_s = sync_interval_s
        self._synced_at = time.monotonic()
        self._items: List[List[Any]] = []
        self._max_items = max_items

    @classmethod
    def resume(cls, path: str, run: str, *, echo: Optional[IO[str]] = None) -> EventWriter:
        """Continue numbering after the last complete event already in ``path``.

        A torn last line (the process was killed mid-write) is cut off first so the file
        stays one valid event per line.
        """
        last = 0
        good_end = 0
        if os.path.exists(path):
            with open(path, "rb") as fh:
                data = fh.read()
            good_end = data.rfind(b"\n") + 1
            for n, raw in enumerate(data[:good_end].split(b"\n"), 1):
                if raw.strip():
                    text = raw.decode("utf-8", errors="replace")
                    last = max(last, parse_line(text, lineno=n).seq)
            if good_end != len(data):
                with open(path, "r+b") as fh:
                    fh.truncate(good_end)
        return cls(path, run, echo=echo, start_seq=last)

    def emit(self, etype: str, **data: Any) -> Event:
        self.seq += 1
        event = Event(seq=self.seq, type=etype, run=self.run, ts=utc_now(), data=data)
        if etype == ITEM_DONE:
            # Held, and written with the batch's next event (``progress`` follows every
            # batch). The ledger holds the items already, and a resume replays any item
            # event a killed runner had not written yet.
            self._items.append(item_record(event.seq, event.ts, data))
            if len(self._items) >= self._max_items:
                self._write_items()
            return event
        capped = cap_lists(data, event.seq, self._run_dir)
        if capped is not data:
            event = Event(seq=event.seq, type=etype, run=self.run, ts=event.ts, data=capped)
        self._write_items()
        self._write(event.to_line(), sync=etype in self.SYNC_TYPES)
        return event

    def _write_items(self) -> None:
        if self._items:
            items, self._items = self._items, []
            last = items[-1]
            self._write(_line({"seq": last[0], "type": ITEM_BATCH, "run": self.run,
                               "ts": last[1], "fields": list(ITEM_FIELDS), "items": items}),
                        count=len(items))

    def _write(self, line: str, *, sync: bool = False, count: int = 1) -> None:
        """Append one line (flushed), sync as the class says, then echo it."""
        self._fh.write(line)
        self._fh.flush()
        self._since_sync += count
        if sync or (self._since_sync >= self._sync_every
                    and time.monotonic() - self._synced_at >= self._sync_interval_s):
            os.fsync(self._fh.fileno())
            self._since_sync = 0
            self._synced_at = time.monotonic()
        if self._echo is not None:
            try:  # after the file's flush: durable before visible
                self._echo.write(line)
                self._echo.flush()
            except (BrokenPipeError, ValueError, OSError):
                self._echo = None  # a reader that went away must not stop the run

    def close(self) -> None:
        if not self._fh.closed:
            self._write_items()
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()


def default_echo() -> IO[str]:
    return sys.stdout
