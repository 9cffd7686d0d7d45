"""How far to trust the next forecast: every volume's forecast scored against its actual.

A volume run keeps its score in its ``forecast`` (bot/service/forecast_inputs.py,
``check_volume``: ``error_pct`` against the middle, ``within_range``, what it was scored
on). This gathers them: one score per volume, and the record of all of them (how many,
the median and the worst error, how many fell inside their range), for ``preflight runs``
and its ``--json``. Pure: runs in, numbers and words out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bot.pilot.record import Run, RunRecord


@dataclass(frozen=True)
class Score:
    run: str
    name: str
    error_pct: float
    within: bool
    partial: bool      # scored on the items its attempts recorded (stopped, failed)
    calibrated: bool   # the forecast rested on a calibration (else on the pilot alone)

    def cell(self) -> str:
        """The score in a few characters: "+6.8% in", "−45.5% out"."""
        sign = "−" if self.error_pct < 0 else "+"
        return f"{sign}{abs(self.error_pct):.1f}% {'in' if self.within else 'out'}" + \
            ("*" if self.partial else "")


def score_of(run: RunRecord) -> Score | None:
    """A volume run's score, when its forecast was checked against its actual time."""
    fc = run.forecast if isinstance(run, Run) else None
    if run.kind != "volume" or fc is None:
        return None
    error = fc.number("error_pct")
    if error is None:
        return None
    return Score(run.id, run.name, error, fc.values.get("within_range") is True,
                 fc.values.get("scored") == "partial", fc.values.get("calibrated") is True)


def record_line(runs: Sequence[RunRecord]) -> str | None:
    """One sentence on the forecasts of the volumes among ``runs``; None without any."""
    scores = [s for s in (score_of(r) for r in runs) if s is not None]
    if not scores:
        return None
    errors = [abs(s.error_pct) for s in scores]
    inside = sum(1 for s in scores if s.within)
    worst = max(scores, key=lambda s: abs(s.error_pct))
    calibrated = sum(1 for s in scores if s.calibrated)
    return (f"Forecast track record: {len(scores)} volume{'s' if len(scores) != 1 else ''} "
            f"scored ({calibrated} calibrated); median error {statistics.median(errors):.1f}%"
            f" of the middle, {inside} of {len(scores)} inside the range; worst "
            f"{worst.cell().rsplit(' ', 1)[0]} ({worst.run.split('-', 1)[0]})")
