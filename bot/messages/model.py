"""The neutral message model: what the service says, before any transport renders it.

The service publishes ``Message`` objects keyed by purpose ("plan", "status",
"first_error", "balance", "evidence", "verdict", "decision"). A transport keeps one
visible message per (run, key): publishing the same key again updates it in place
(rich Live in the terminal, ``chat.update`` in Slack).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, Union


@dataclass(frozen=True)
class Heading:
    text: str


@dataclass(frozen=True)
class Text:
    text: str
    style: Literal["plain", "ok", "warn", "error", "muted"] = "plain"


@dataclass(frozen=True)
class Fields:
    """Label/value pairs (the plan summary, a stage's facts)."""

    pairs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class StageLine:
    stage: str
    state: Literal["pending", "running", "passed", "failed", "skipped", "interrupted"]
    detail: str = ""
    elapsed_s: float | None = None  # a finished stage: its duration; running: so far
    started: float | None = None  # a running stage: its start (epoch s), for a live clock


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    total_rows: int | None = None  # when rows is a truncated view of a larger table


@dataclass(frozen=True)
class Button:
    action: str  # "approve" | "fix-env" | "revise"
    label: str
    value: str  # the run id
    style: Literal["primary", "danger", "default"] = "default"


@dataclass(frozen=True)
class Actions:
    buttons: tuple[Button, ...]


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    pace: str = ""  # items/s, ETA, per-worker rates, when the runner measured them
    per_s: float | None = None  # items per second, measured while following
    eta_s: float | None = None  # seconds left at that rate


@dataclass(frozen=True)
class Attachment:
    """A file the transport should attach (balance.csv when a table is too large)."""

    path: str
    title: str


Block = Union[Heading, Text, Fields, StageLine, Table, Actions, Progress, Attachment]


@dataclass(frozen=True)
class Message:
    run_id: str
    key: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)
    summary: str = ""  # one line: notification text / fallback


class Notifier(Protocol):
    """What the service needs from a transport."""

    def publish(self, message: Message) -> None: ...


class NullNotifier:
    def publish(self, message: Message) -> None:
        return None


class RecordingNotifier:
    """Keeps the last message per (run, key) and the full history; used by tests and CLI."""

    def __init__(self) -> None:
        self.history: list[Message] = []
        self.latest: dict[tuple[str, str], Message] = {}

    def publish(self, message: Message) -> None:
        self.history.append(message)
        self.latest[(message.run_id, message.key)] = message
