"""The volume's own clocks, decided before approval: its time limit and its batch timeout.

The volume's driver runs as the ``pilot`` stage of the volume run, whose watchdog would
otherwise kill it after the pilot's hour. Its time limit is ``volume.time_limit_s`` when
the manifest sets it, else twice the forecast's high estimate plus half an hour for the
setup (upload, card proofs, Ray start, diagnostics), else (no forecast) a day; never past
the lease's end. The batch timeout before any batch of the volume finished comes from the
pilot's measured per-item time (the forecast's p90) times the volume's batch size (the
runner allows ten times that, at least 60 s, and never less than the batch's item clock),
or ``volume.batch_timeout_s``. The item timeout on the workers is ``task.item_timeout_s``
when the manifest sets it, else ten times the pilot's p90 per item (5 s to 300 s): with
300 s per item a batch's item clock outlasted the 60 s batch timeout, so a hung input
stopped a worker at every halving of its batch (7 min and 6 workers for one input).

Pure: the run's stored manifest, plan and forecast in, numbers and sentences out; the
forecast message shows them and the volume's spec carries them (bot/pilot/specbuild.py).
docs/volume.md, "Time limits".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.pilot.clock import read_time
from bot.pilot.forecast_stats import duration, secs
from runner.spec import ITEM_MARGIN, batch_clock_s

TIME_MARGIN = 2.0          # × the forecast's high estimate
SETUP_S = 1800.0           # + this for upload, card proofs, Ray start, diagnostics
NO_FORECAST_S = 86400.0    # without a forecast or a manifest value: a day
RUNNER_FACTOR = 10         # the runner's batch timeout is this × the slowest batch (>= 60 s)
RUNNER_MIN_S = 60
ITEM_GRACE_S = 10          # the runner's batch timeout waits this beyond a batch's item clock
ITEM_FACTOR = 10           # task.item_timeout_s unset: the volume's is this × the pilot's p90
ITEM_MIN_S = 5.0           # ... at least this
ITEM_DEFAULT_S = 300.0     # ... at most this (the pilot's own without task.item_timeout_s)


@dataclass(frozen=True)
class VolumeLimits:
    time_limit_s: float
    time_why: str
    pilot_batch_s: float      # 0: not measured
    batch_timeout_s: float    # 0: the runner's rule (10 × slowest batch, at least 60 s)
    batch_why: str
    in_flight: int
    notes: tuple[str, ...] = ()
    item_timeout_s: float = ITEM_DEFAULT_S  # each item's on the workers (0: off)
    item_why: str = "the default"
    batch_size: int = 1
    # the limit came from the forecast (not volume.time_limit_s): the driver widens it from
    # the rate it measures, within the lease (runner/volume_limit.py); the lease's end
    adapts: bool = False
    lease_ends_at: float = 0.0

    def first_batch_timeout_s(self) -> float:
        """The batch timeout before any batch of the volume finished (the runner's rule):
        the manifest's, else 10 × the pilot's batch, at least 60 s, and never before the
        batch's item clock (its items × the item timeout) could fire, plus a grace."""
        if self.batch_timeout_s:
            return self.batch_timeout_s
        return max(RUNNER_MIN_S, RUNNER_FACTOR * self.pilot_batch_s, self.item_clock_s()
                   + ITEM_GRACE_S if self.item_timeout_s > 0 else 0.0)

    def item_clock_s(self) -> float:
        """A whole batch's item clock on its worker (``runner.spec.batch_clock_s``): one item
        the item timeout, the others a margin over the pilot's pace."""
        per_item = self.pilot_batch_s / self.batch_size if self.batch_size else 0.0
        return batch_clock_s(self.batch_size, self.item_timeout_s, per_item)

    def rows(self) -> tuple[tuple[str, str, str], ...]:
        """(label, value, formula) rows for the forecast message."""
        item = ("off" if self.item_timeout_s <= 0 else secs(self.item_timeout_s))
        clock = (f"; a batch of {self.batch_size}: interrupted on its worker after "
                 f"{secs(self.item_clock_s())} (one item the timeout, each other "
                 f"{ITEM_MARGIN} × the pilot's p90), its items then run alone" if
                 self.item_timeout_s > 0 else "")
        limit_why = self.time_why + ("; widened while the volume runs when its items run "
                                     "slower than forecast, within the lease" if self.adapts
                                     else "")
        return (("Volume time limit", duration(self.time_limit_s), limit_why),
                ("Item timeout", item, self.item_why + clock),
                ("Batch timeout", duration(self.first_batch_timeout_s()), self.batch_why))


def volume_limits(manifest: dict[str, Any], plan: dict[str, Any],
                  forecast: Mapping[str, Any] | None, now: datetime) -> VolumeLimits | None:
    """The limits of the volume a pilot would launch (None: the manifest has no volume).
    ``manifest``: the manifest as JSON (``manifest_json``); ``plan``: ``Plan.to_dict()``;
    ``forecast``: the pilot's as stored (``StoredForecast.values``)."""
    volume = manifest.get("volume")
    if not volume:
        return None
    notes: list[str] = []
    possible = bool(forecast and forecast.get("possible"))
    high = float(forecast["high_s"]) if possible and forecast else 0.0
    given = volume.get("time_limit_s")
    if isinstance(given, (int, float)) and given > 0:
        limit, why = float(given), "volume.time_limit_s"
        if possible and limit < high:
            notes.append(f"volume.time_limit_s ({duration(limit)}) is shorter than the "
                         f"forecast's high estimate ({duration(high)}): the volume may be "
                         "stopped before it ends (`preflight resume` runs the rest)")
    elif possible:
        limit = float(math.ceil(TIME_MARGIN * high + SETUP_S))
        why = (f"{TIME_MARGIN:g} × the forecast's high estimate {duration(high)} + "
               f"{duration(SETUP_S)} for the setup")
    else:
        limit, why = NO_FORECAST_S, "no forecast and no volume.time_limit_s: one day"
    ends = _lease_end(plan, forecast)
    if ends is not None:
        left = (ends - now).total_seconds()
        if 0 < left < limit:
            notes.append(f"the time limit ({duration(limit)}) would end after the lease; "
                         f"cut to the lease's end ({duration(left)} from now)")
            limit, why = float(math.floor(left)), f"{why}, cut to the lease's end"
    size = int(volume.get("batch_size") or (manifest.get("task") or {}).get("batch_size") or 1)
    per_item = 0.0
    if possible and forecast:
        per_item = float(forecast.get("p90_s") or 0)
    pilot_batch = per_item * size
    item, item_why = _item_timeout(manifest, per_item)
    fixed = volume.get("batch_timeout_s")
    if isinstance(fixed, (int, float)) and fixed > 0:
        batch_timeout, batch_why = float(fixed), "volume.batch_timeout_s"
    elif pilot_batch > 0:
        batch_timeout = 0.0
        batch_why = (f"{RUNNER_FACTOR} × the slowest batch, at least {RUNNER_MIN_S} s; before "
                     f"any batch finished: the pilot's {secs(per_item)} p90 per item × "
                     f"{size} items per batch = {secs(pilot_batch)}")
    else:
        batch_timeout = 0.0
        batch_why = (f"{RUNNER_FACTOR} × the slowest batch, at least {RUNNER_MIN_S} s (no "
                     "per-item time from the pilot)")
    clock = batch_clock_s(size, item, per_item)
    if not batch_timeout and item > 0:
        batch_why += (f"; never before the batch's item clock ({secs(clock)}) + "
                      f"{ITEM_GRACE_S} s: a hung input is interrupted, no worker stopped")
    elif batch_timeout and 0 < item and batch_timeout < clock:
        notes.append(f"volume.batch_timeout_s ({secs(batch_timeout)}) is shorter than a "
                     f"batch's item clock ({secs(clock)}): a hung input stops its worker "
                     "before its item timeout interrupts it")
    return VolumeLimits(time_limit_s=limit, time_why=why, pilot_batch_s=round(pilot_batch, 6),
                        batch_timeout_s=batch_timeout, batch_why=batch_why,
                        in_flight=int(volume.get("in_flight") or 2), notes=tuple(notes),
                        item_timeout_s=item, item_why=item_why, batch_size=size,
                        adapts=why != "volume.time_limit_s" and not why.startswith(
                            "volume.time_limit_s,"),
                        lease_ends_at=ends.timestamp() if ends is not None else 0.0)


def _item_timeout(manifest: dict[str, Any], per_item: float) -> tuple[float, str]:
    """Each item's timeout on the volume's workers: ``task.item_timeout_s`` when the
    manifest sets it; else ten times the pilot's p90 per item, at least 5 s and at most
    the pilot's 300 s, so a hung input is interrupted (and its worker kept) long before a
    batch timeout, and costs seconds, not minutes."""
    given = (manifest.get("task") or {}).get("item_timeout_s")
    return item_timeout_for(given if isinstance(given, (int, float))
                            and not isinstance(given, bool) else None, per_item)


def item_timeout_for(given: float | None, per_item: float) -> tuple[float, str]:
    """``_item_timeout``'s rule from ``task.item_timeout_s`` (None: unset) and the pilot's
    p90 per item (the forecast's rework of inputs that hang reads it too)."""
    if given is not None:
        return float(given), "task.item_timeout_s"
    if per_item > 0:
        item = min(ITEM_DEFAULT_S, max(ITEM_MIN_S, ITEM_FACTOR * per_item))
        return round(item, 3), (f"{ITEM_FACTOR} × the pilot's {secs(per_item)} p90 per item, "
                                f"at least {secs(ITEM_MIN_S)}, at most {secs(ITEM_DEFAULT_S)} "
                                "(task.item_timeout_s not set)")
    return ITEM_DEFAULT_S, "the default: no per-item time from the pilot (task.item_timeout_s " \
        "not set)"


def _lease_end(plan: dict[str, Any], forecast: Mapping[str, Any] | None) -> datetime | None:
    for value in ((forecast or {}).get("lease_end"), plan.get("ends_at")):
        moment = read_time(value) if isinstance(value, str) else None
        if moment is not None:
            return moment
    return None
