"""The volume's calibration as the bot reads it: the ``calibrate`` stage's facts, checked.

The pilot's node ran a random sample of the volume's inputs at the volume's batch size on
the workers the volume would start there (runner/stages/calibrate.py). Its facts come from
the node, so they are checked once here (numbers that are not numbers, negative times,
lists that are not lists are dropped, never trusted) and handed on as one frozen record:
the forecast (bot/pilot/forecast_model.py) and the messages read this, not the dict.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from bot.pilot.clock import read_time

CALIBRATE = "calibrate"
IDS_SHOWN = 10             # sample ids a message names (all of them: the stage's facts)


@dataclass(frozen=True)
class Measured:
    """One call on a worker: its items, their bytes, its seconds there."""

    items: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class Calibration:
    """What the calibration measured (``skipped``: why it did not run; then nothing else)."""

    batch_size: int = 0
    workers: int = 0
    batches: tuple[Measured, ...] = ()
    warmup: tuple[Measured, ...] = ()
    record: tuple[Measured, ...] = ()      # the driver's recording of each batch (bytes 0)
    ray_start_s: float | None = None       # Ray up on the node
    workers_ready_s: float | None = None   # Ray up and every worker's handler loaded
    ray_stop_s: float | None = None        # the workers and Ray stopped, at the end
    timed_wall_s: float | None = None      # the timed batches' wall time, through one driver
    pace: tuple[int, float] | None = None  # (batches, wall s) through the volume's Driver
    output_files: int = 0
    output_bytes: int = 0
    recorded: int = 0
    refused: int = 0
    failed_batches: int = 0
    errors: tuple[str, ...] = ()
    sample_ids: tuple[str, ...] = ()
    sample_total: int = 0                  # ids timed (the facts may hold the first 200)
    warmup_ids: tuple[str, ...] = ()
    listed: int = 0
    seconds: float | None = None           # the stage's own time (what it cost)
    skipped: str | None = None
    # the sample was drawn on the bot host (a corpus the node does not hold) and sent with
    # the pilot: where, and how many inputs were sent (bot/dispatch/calibration_sample.py)
    drawn_on: str | None = None
    sample_sent: int = 0

    @property
    def timed_items(self) -> int:
        return sum(b.items for b in self.batches)

    def ids_line(self) -> str:
        """The sample's ids, the first ``IDS_SHOWN`` named, the rest counted."""
        shown = ", ".join(self.sample_ids[:IDS_SHOWN])
        more = self.sample_total - min(len(self.sample_ids), IDS_SHOWN)
        return shown + (f" … and {more:,} more (the calibrate stage's facts)" if more > 0
                        else "")


def calibration_of(stages: list[dict[str, Any]]) -> Calibration | None:
    """The calibration of a pilot from its stage rows; None when it had none."""
    row = next((s for s in stages if s.get("stage") == CALIBRATE), None)
    if row is None:
        return None
    seconds = _span(row)
    if row.get("state") != "passed":
        why = str(row.get("reason") or (row.get("error") or {}).get("message") or
                  row.get("state") or "did not run")
        return Calibration(skipped=f"{row.get('state')}: {why}", seconds=seconds)
    facts = row.get("facts") or {}
    ids = _strings(facts.get("sample_ids"))
    return Calibration(
        batch_size=_int(facts.get("batch_size")), workers=_int(facts.get("workers")),
        batches=_calls(facts.get("batches")), warmup=_calls(facts.get("warmup")),
        record=_calls(facts.get("record")),
        ray_start_s=_float(facts.get("ray_start_s")),
        workers_ready_s=_float(facts.get("workers_ready_s")),
        ray_stop_s=_float(facts.get("ray_stop_s")),
        timed_wall_s=_float(facts.get("timed_wall_s")), pace=_pace(facts.get("pace")),
        output_files=_int(facts.get("output_files")),
        output_bytes=_int(facts.get("output_bytes")),
        recorded=_int(facts.get("record_items")), refused=_int(facts.get("refused")),
        failed_batches=_int(facts.get("failed_batches")),
        errors=_strings(facts.get("errors"))[:5], sample_ids=ids,
        sample_total=max(len(ids), _int(facts.get("sample_ids_total"))),
        warmup_ids=_strings(facts.get("warmup_ids")), listed=_int(facts.get("listed")),
        seconds=seconds, drawn_on=str(facts["drawn_on"])[:100]
        if isinstance(facts.get("drawn_on"), str) and facts["drawn_on"] else None,
        sample_sent=_int(facts.get("sample_sent")))


def calibration_cost(cal: Calibration, cards: int, lot_price: Decimal,
                     cards_per_lot: int) -> Decimal | None:
    """What the calibration's time on ``cards`` is worth at the lease's price, to the cent."""
    if cal.seconds is None or cards_per_lot < 1:
        return None
    value = Decimal(repr(cal.seconds)) * cards * lot_price / (cards_per_lot * 86400)
    return value.quantize(Decimal("0.01"), ROUND_HALF_UP)


def _span(row: dict[str, Any]) -> float | None:
    began, ended = read_time(row.get("started_at")), read_time(row.get("ended_at"))
    if not isinstance(began, datetime) or not isinstance(ended, datetime):
        return None
    try:
        return max(0.0, (ended - began).total_seconds())
    except TypeError:  # one aware, one naive
        return None


def _calls(value: Any) -> tuple[Measured, ...]:
    out = []
    for entry in value if isinstance(value, list) else ():
        if not isinstance(entry, dict):
            continue
        items, seconds = _int(entry.get("items")), _float(entry.get("seconds"))
        if items > 0 and seconds is not None:
            out.append(Measured(items, _int(entry.get("bytes")), seconds))
    return tuple(out)


def _pace(value: Any) -> tuple[int, float] | None:
    if not isinstance(value, dict):
        return None
    batches, wall = _int(value.get("batches")), _float(value.get("wall_s"))
    return (batches, wall) if batches and wall else None


def _float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and \
            0 <= value < float("inf"):
        return float(value)
    return None


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and \
        value > 0 else 0


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value if isinstance(v, (str, int))) \
        if isinstance(value, list) else ()
