"""The run's payloads, typed: the verdict, the balance, the evidence record, the forecast (or
its check after the volume) and the stop note, each a JSON cell of the ``runs`` row.

Each is parsed once, where the run leaves the store (``Run.from_row``), then trusted: the
messages, the report and the policy read fields, not string keys. The parse is tolerant of
rows written by an older version (a missing key takes its default, an unknown key is
ignored) and strict on the rest: a cell whose value has the wrong type raises
``StoreError`` naming the run, the column and the field (the state database was changed
by hand or by another program). What a node sends is checked where it enters (the balance:
``bot.pilot.balance_check``; the evidence event: ``Evidence.from_event``), so that a forged
event is flagged there and never makes its run unreadable here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from bot.errors import StoreError
from bot.pilot.forecast_types import Figure

JSON = Mapping[str, object]


class _Cell:
    """Reads one JSON cell's fields, naming the run, the column and the field when one
    holds the wrong type."""

    def __init__(self, run: str, column: str, value: object) -> None:
        if not isinstance(value, Mapping):
            raise StoreError(f"run {run}: column {column} holds {type(value).__name__} "
                             f"{_shown(value)}, not an object: the state database was changed "
                             "by hand or by another program")
        self.run, self.column, self.value = run, column, value

    def bad(self, name: str, want: str) -> StoreError:
        return StoreError(f"run {self.run}: column {self.column}, field {name} holds "
                          f"{_shown(self.value.get(name))}, not {want}: the state database "
                          "was changed by hand or by another program")

    def _value(self, name: str, check: Callable[[object], bool], want: str) -> object:
        """The field's value (None: absent); StoreError when ``check`` refuses it."""
        value = self.value.get(name)
        if value is not None and not check(value):
            raise self.bad(name, want)
        return value

    def text(self, name: str) -> str | None:
        value = self._value(name, lambda v: isinstance(v, str), "text")
        return value if isinstance(value, str) else None

    def flag(self, name: str, default: bool = False) -> bool:
        value = self._value(name, lambda v: isinstance(v, bool), "true or false")
        return value if isinstance(value, bool) else default

    def maybe_flag(self, name: str) -> bool | None:
        value = self._value(name, lambda v: isinstance(v, bool), "true, false or null")
        return value if isinstance(value, bool) else None

    def count(self, name: str) -> int | None:
        value = self._value(name, _is_count, "a non-negative integer")
        return value if isinstance(value, int) else None

    def texts(self, name: str) -> tuple[str, ...]:
        value = self._value(name, lambda v: isinstance(v, list), "a list")
        return tuple(map(str, value)) if isinstance(value, list) else ()

    def objects(self, name: str) -> tuple[JSON, ...]:
        value = self._value(name, lambda v: isinstance(v, list) and all(
            isinstance(i, Mapping) for i in v), "a list of objects")
        return tuple(value) if isinstance(value, list) else ()

    def mapping(self, name: str) -> JSON | None:
        value = self._value(name, lambda v: isinstance(v, Mapping), "an object")
        return value if isinstance(value, Mapping) else None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: object) -> str:
    return repr(value)[:80]


def _str(value: object) -> str:
    return "" if value is None else str(value)


# -- the verdict ------------------------------------------------------------------------

@dataclass(frozen=True)
class VerdictCheck:
    ok: bool
    text: str
    warn: bool = False  # passed, but worth a look (a refusal nobody expected)

    @property
    def mark(self) -> str:
        return "⚠" if self.warn else "✓" if self.ok else "✗"

    @property
    def style(self) -> Literal["warn", "ok", "error"]:
        return "warn" if self.warn else "ok" if self.ok else "error"


@dataclass(frozen=True)
class Verdict:
    """The pilot's rules' verdict (the ``verdict`` column): passed or not, and each check
    with its line."""

    passed: bool
    checks: tuple[VerdictCheck, ...] = ()

    @classmethod
    def from_stored(cls, value: JSON) -> Verdict:
        checks = value.get("checks")
        return cls(bool(value.get("passed")), tuple(
            VerdictCheck(bool(c.get("ok")), str(c.get("text")), bool(c.get("warn")))
            for c in (checks if isinstance(checks, list) else []) if isinstance(c, dict)))


# -- the stop note ----------------------------------------------------------------------

@dataclass(frozen=True)
class StopNote:
    """Who stopped a run, when and why (the ``stop`` column)."""

    by: str
    reason: str
    at: str

    @classmethod
    def from_stored(cls, run: str, value: JSON) -> StopNote:
        """StoreError naming the run when the column does not hold a stop note."""
        by, reason, at = (value.get(name) for name in ("by", "reason", "at"))
        if not (isinstance(by, str) and isinstance(reason, str) and isinstance(at, str)):
            raise StoreError(f"run {run}: column stop holds {value!r}, not a stop note (by, "
                             "reason, at): the state database was changed by hand or by "
                             "another program")
        return cls(by, reason, at)

    def told(self) -> str:
        """``by <who> at <when>: <why>``, as a message says it."""
        return f"by {self.by} at {self.at}: {self.reason}"


# -- the balance ------------------------------------------------------------------------

@dataclass(frozen=True)
class BalanceRow:
    """A problem or a warning of the balance (``kind``, the input ``id``, ``detail``)."""

    kind: str
    id: str = ""
    detail: str = ""


@dataclass(frozen=True)
class ItemRow:
    """One input's outcome as a message shows it: the balance's first rows, or its sample
    (with the beginning of the input, ``input_head``; a ``note`` row says what was left
    out of the sample)."""

    id: str
    status: str = ""
    category: str = ""
    reason: str = ""
    input_head: str = ""
    note: str = ""

    @property
    def result(self) -> str:
        """Its category when accepted, else its reason."""
        return self.category or self.reason


@dataclass(frozen=True)
class Recount:
    """The bot's own recount from the item events it recorded."""

    accepted: int | None = None
    refused: int | None = None
    total: int | None = None
    ok: bool = False


@dataclass(frozen=True)
class Balance:
    """The run's balance (the ``balance`` column): the runner's counts, its problems and
    warnings, the first rows and the sample, and the bot's recount. ``malformed``: the
    node's event did not type-check (``bot.pilot.balance_check``): then none of its
    figures is kept, only why and the recount."""

    ok: bool = False
    accepted: int | None = None
    refused: int | None = None
    total: int | None = None
    problems: tuple[BalanceRow, ...] = ()
    warnings: tuple[BalanceRow, ...] = ()
    warnings_count: int | None = None
    by_category: tuple[tuple[str, int], ...] = ()  # sorted by category
    items: tuple[ItemRow, ...] = ()  # the first rows only
    items_total: int | None = None  # how many rows there are
    sample: tuple[ItemRow, ...] = ()
    malformed: tuple[str, ...] = ()
    recheck: Recount | None = None

    @property
    def rows(self) -> int:
        """How many input rows the balance stands for (``items_total``, else its rows)."""
        return self.items_total or len(self.items)

    @classmethod
    def from_stored(cls, run: str, value: object) -> Balance:
        cell = _Cell(run, "balance", value)
        by_cat = cell.mapping("by_category") or {}
        if not all(_is_count(n) for n in by_cat.values()):
            raise cell.bad("by_category", "a mapping of categories to counts")
        recheck = cell.mapping("recheck")
        return cls(
            ok=cell.flag("ok"), accepted=cell.count("accepted"), refused=cell.count("refused"),
            total=cell.count("total"), problems=_rows(cell.objects("problems")),
            warnings=_rows(cell.objects("warnings")),
            warnings_count=cell.count("warnings_count"),
            by_category=tuple(sorted((str(k), int(str(n))) for k, n in by_cat.items())),
            items=tuple(_item(i) for i in cell.objects("items")),
            items_total=cell.count("items_total"),
            sample=tuple(_item(s) for s in cell.objects("sample")),
            malformed=cell.texts("malformed"),
            recheck=None if recheck is None else _recount(_Cell(run, "balance.recheck",
                                                                recheck)))


def _rows(values: tuple[JSON, ...]) -> tuple[BalanceRow, ...]:
    return tuple(BalanceRow(_str(v.get("kind")), _str(v.get("id")), _str(v.get("detail")))
                 for v in values)


def _item(value: JSON) -> ItemRow:
    return ItemRow(_str(value.get("id")), _str(value.get("status")),
                   _str(value.get("category")), _str(value.get("reason")),
                   input_head=_str(value.get("input_head") or value.get("excerpt")),
                   note=_str(value.get("note")))


def _recount(cell: _Cell) -> Recount:
    return Recount(cell.count("accepted"), cell.count("refused"), cell.count("total"),
                   cell.flag("ok"))


# -- the evidence record ----------------------------------------------------------------

EVIDENCE_TEXTS = ("dest", "node_dest", "verified_by", "fetch_error", "dest_refused",
                  "malformed")
EVIDENCE_COUNTS = ("files", "bytes", "shards")


@dataclass(frozen=True)
class Evidence:
    """The run's evidence record (the ``evidence`` column): where the copy is (``dest``, as
    the bot decided it; ``node_dest``: what the node claimed), what it holds, whether it
    verified and who checked (``verified_by: node``: the node's word only), and why the
    bot did not take the node's word (``fetch_error``, ``dest_refused``, ``malformed``: the
    node's event had fields of the wrong type, left out)."""

    dest: str | None = None
    verified: bool = False
    verified_by: str | None = None
    files: int | None = None
    bytes: int | None = None
    shards: int | None = None
    node_dest: str | None = None
    fetch_error: str | None = None
    dest_refused: str | None = None
    malformed: str | None = None

    @classmethod
    def from_stored(cls, run: str, value: object) -> Evidence:
        cell = _Cell(run, "evidence", value)
        return cls(dest=cell.text("dest"), verified=cell.flag("verified"),
                   verified_by=cell.text("verified_by"), files=cell.count("files"),
                   bytes=cell.count("bytes"), shards=cell.count("shards"),
                   node_dest=cell.text("node_dest"), fetch_error=cell.text("fetch_error"),
                   dest_refused=cell.text("dest_refused"), malformed=cell.text("malformed"))

    @staticmethod
    def from_event(raw: JSON) -> dict[str, object]:
        """A node's ``evidence`` event as the bot records it: its fields of the right type
        kept, any other (a forged event's) named in ``malformed`` and left out, and then
        not verified. What the bot adds (``bot.service.report_files.settle_evidence``)
        comes after."""
        kept: dict[str, object] = {}
        wrong: list[str] = []
        for key, value in raw.items():
            if key in EVIDENCE_COUNTS and not _is_count(value) and value is not None:
                wrong.append(f"{key} is {_shown(value)}, not a non-negative integer")
            elif key in EVIDENCE_TEXTS and not isinstance(value, str | None):
                wrong.append(f"{key} is {_shown(value)}, not text")
            elif key == "verified" and not isinstance(value, bool):
                wrong.append(f"verified is {_shown(value)}, not true or false")
            else:
                kept[key] = value
        if wrong:
            kept["verified"] = False
            kept["malformed"] = ("the node's evidence event cannot be read: "
                                 + "; ".join(wrong))
        return kept


# -- the forecast (or, for a volume run, its check) --------------------------------------

@dataclass(frozen=True)
class StoredForecast:
    """The ``forecast`` column: a pilot's forecast of its volume (``possible``, ``reason``,
    ``fits``, its figures and notes, and its numbers by name: ``low_s``, ``high_s``,
    ``margin_s``, ``lease_end``, ...), or a volume run's check of the forecast against its
    actual time (``is_check``: ``actual_s``, ``error_pct``, ``formula``, ...). The numbers
    stay a read-only mapping (``values``): the forecast's arithmetic names dozens of them,
    and ``number`` reads one, checked."""

    possible: bool = False
    reason: str | None = None
    fits: bool | None = None
    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = ()
    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def is_check(self) -> bool:
        """A volume run's check of its forecast against the actual (not a forecast)."""
        return "actual_s" in self.values

    @property
    def proven(self) -> Mapping[str, Any]:
        """The summary of the nodes the forecast was made on once proven ({}: none)."""
        proven = self.values.get("proven")
        return proven if isinstance(proven, Mapping) else {}

    def number(self, key: str) -> float | None:
        """A number of the forecast by name (None: absent or not a number)."""
        value = self.values.get(key)
        return float(value) if isinstance(value, int | float) and \
            not isinstance(value, bool) else None

    def text(self, key: str) -> str | None:
        value = self.values.get(key)
        return None if value is None else str(value)

    def as_dict(self) -> dict[str, Any]:
        """The forecast as stored (a copy): what the forecast's arithmetic takes."""
        return dict(self.values)

    @classmethod
    def from_stored(cls, run: str, value: object) -> StoredForecast:
        cell = _Cell(run, "forecast", value)
        return cls(possible=cell.flag("possible"), reason=cell.text("reason"),
                   fits=cell.maybe_flag("fits"),
                   figures=tuple(Figure(_str(f.get("key")), _str(f.get("label")),
                                        _str(f.get("value")), _str(f.get("formula")))
                                 for f in cell.objects("figures")),
                   notes=cell.texts("notes"),
                   values=MappingProxyType(dict(cell.value)))
