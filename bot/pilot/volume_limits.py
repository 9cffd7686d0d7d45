"""The volume's own clocks, decided before approval: its time limit and its batch timeout.

The volume's driver runs as the ``pilot`` stage of the volume run, whose watchdog would
otherwise kill it after the pilot's hour. Its time limit is ``volume.time_limit_s`` when
the manifest sets it, else twice the forecast's high estimate plus half an hour for the
setup (upload, card proofs, Ray start, diagnostics), else (no forecast) a day; never past
the lease's end. The batch timeout before any batch of the volume finished comes from the
pilot's measured per-item time (the forecast's p90) times the volume's batch size (the
runner allows ten times that, at least 60 s), or ``volume.batch_timeout_s``.

Pure: the run's stored manifest, plan and forecast in, numbers and sentences out; the
forecast message shows them and the volume's spec carries them (bot/pilot/specbuild.py).
docs/volume.md, "Time limits".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.pilot.clock import read_time
from bot.pilot.forecast import duration, secs

TIME_MARGIN = 2.0          # × the forecast's high estimate
SETUP_S = 1800.0           # + this for upload, card proofs, Ray start, diagnostics
NO_FORECAST_S = 86400.0    # without a forecast or a manifest value: a day
RUNNER_FACTOR = 10         # the runner's batch timeout is this × the slowest batch (>= 60 s)
RUNNER_MIN_S = 60


@dataclass(frozen=True)
class VolumeLimits:
    time_limit_s: float
    time_why: str
    pilot_batch_s: float      # 0: not measured
    batch_timeout_s: float    # 0: the runner's rule (10 × slowest batch, at least 60 s)
    batch_why: str
    in_flight: int
    notes: tuple[str, ...] = ()

    def rows(self) -> tuple[tuple[str, str, str], ...]:
        """(label, value, formula) rows for the forecast message."""
        batch = (duration(self.batch_timeout_s) if self.batch_timeout_s
                 else duration(max(RUNNER_MIN_S, RUNNER_FACTOR * self.pilot_batch_s)))
        return (("Volume time limit", duration(self.time_limit_s), self.time_why),
                ("Batch timeout", batch, self.batch_why))


def volume_limits(manifest: dict[str, Any], plan: dict[str, Any],
                  forecast: dict[str, Any] | None, now: datetime) -> VolumeLimits | None:
    """The limits of the volume a pilot would launch (None: the manifest has no volume).
    ``manifest``: the manifest as JSON (``manifest_json``); ``plan``: ``Plan.to_dict()``."""
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
    return VolumeLimits(time_limit_s=limit, time_why=why, pilot_batch_s=round(pilot_batch, 6),
                        batch_timeout_s=batch_timeout, batch_why=batch_why,
                        in_flight=int(volume.get("in_flight") or 2), notes=tuple(notes))


def _lease_end(plan: dict[str, Any], forecast: dict[str, Any] | None) -> datetime | None:
    for value in ((forecast or {}).get("lease_end"), plan.get("ends_at")):
        moment = read_time(value) if isinstance(value, str) else None
        if moment is not None:
            return moment
    return None
