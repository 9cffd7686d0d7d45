"""The forecast's samples, statistics and wording: the recorded items, a sample's spread,
Student's t, the size fit, quantiles, and how durations, shares and counts are written
(bot/pilot/forecast.py uses them; pure functions, no I/O)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

MIN_SAMPLES = 5            # accepted items with a per-item time needed for a forecast
SIZE_SPREAD = 2.0          # sizes "differ" when the largest is at least this x the smallest
Z90 = 1.645                # the normal's 95th percentile: a two-sided 90 % range
ASSUMED_CV = 0.5           # items' spread (sd ÷ mean) assumed when the pilot could not show it
MIN_CV = 0.05              # the least spread a range keeps (timing noise between two runs)
# Student's t, 95th percentile, by degrees of freedom (a small pilot's mean is uncertain).
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860,
       9: 1.833, 10: 1.812, 11: 1.796, 12: 1.782, 13: 1.771, 14: 1.761, 15: 1.753, 16: 1.746,
       17: 1.740, 18: 1.734, 19: 1.729, 20: 1.725, 25: 1.708, 30: 1.697, 40: 1.684,
       60: 1.671, 120: 1.658}


class ItemOutcome(NamedTuple):
    """One recorded item.done, as the forecast and the report read it (no JSON)."""

    id: str
    status: str | None
    ts: str | None
    elapsed_s: float | None
    input_bytes: int | None


@dataclass(frozen=True)
class Sample:
    """One accepted pilot item: its measured seconds and its input's size.

    ``batch``: the measurement it shares with other items (a handler's batch, timed as a
    whole and shared equally by its items); None: the item was timed on its own (a batch
    of one, a command's or a render's own figure)."""

    seconds: float
    input_bytes: int | None = None
    batch: int | None = None


@dataclass(frozen=True)
class Spread:
    """The per-item time of the volume: its mean, its spread and how sure the pilot is."""

    mean: float
    sd: float
    items: int         # items measured
    units: int         # independent measurements (batches timed as a whole count once)
    z: float           # the 90 % range's multiplier (Student's t for a small pilot)
    skew: float | None
    how: str           # where the spread came from, for the formula


def fastest_unit(samples: tuple[Sample, ...]) -> float:
    """The fastest per-item time of one measurement (a batch's mean, or an item alone)."""
    groups: dict[Any, list[float]] = {}
    for k, sample in enumerate(samples):
        key = ("batch", sample.batch) if sample.batch is not None else ("item", k)
        groups.setdefault(key, []).append(sample.seconds)
    return min((statistics.fmean(v) for v in groups.values()), default=0.0)


def item_spread(samples: tuple[Sample, ...], values: list[float]) -> Spread:
    """Mean and per-item sd of ``values`` (one per sample), batches counted as one
    measurement each: a batch of k items timed as a whole has a mean whose variance is the
    items' variance ÷ k, so the items' variance is Σ k (batch mean − mean)² ÷ (batches − 1).
    One measurement only: the spread is assumed (``ASSUMED_CV``); never under ``MIN_CV``."""
    groups: dict[Any, list[float]] = {}
    for k, (sample, value) in enumerate(zip(samples, values)):
        key = ("batch", sample.batch) if sample.batch is not None else ("item", k)
        groups.setdefault(key, []).append(value)
    units = [(len(vs), statistics.fmean(vs)) for vs in groups.values()]
    n = sum(k for k, _ in units)
    times = [s.seconds for s in samples]
    scale = statistics.fmean(times)  # the spread's floor is relative to the items' time
    mean = sum(k * v for k, v in units) / n
    if len(units) < 2:
        return Spread(mean, ASSUMED_CV * scale, n, len(units), Z90, None,
                      f"one measurement of {plural(n, 'item')} (a batch timed as a whole): "
                      f"sd assumed {ASSUMED_CV:.0%} of the mean")
    var = sum(k * (v - mean) ** 2 for k, v in units) / (len(units) - 1)
    sd = max(math.sqrt(var), MIN_CV * scale)
    how = (f"sd over {plural(len(units), 'measurement')}" if len(units) == n else
           f"sd from {plural(len(units), 'batch', 'batches')} of {plural(n, 'item')} "
           "(each batch's mean, weighted by its items)")
    if sd == MIN_CV * scale and var < sd * sd:
        how += f", at least {MIN_CV:.0%} of the mean"
    return Spread(mean, sd, n, len(units), t95(len(units) - 1), skewness([v for _, v in units]),
                  how)


def skewness(values: list[float]) -> float | None:
    """The sample's skewness (Fisher's g1), None under 3 values or no spread."""
    if len(values) < 3:
        return None
    m = statistics.fmean(values)
    m2 = statistics.fmean([(v - m) ** 2 for v in values])
    if m2 <= 0:
        return None
    return float(statistics.fmean([(v - m) ** 3 for v in values]) / m2 ** 1.5)


def t95(df: int) -> float:
    """Student's t at 95 % for ``df`` degrees of freedom (the next lower tabled df:
    never narrower than the exact figure); the normal's beyond the table."""
    if df < 1:
        return T95[1]
    if df > max(T95):
        return Z90
    return T95[max(d for d in T95 if d <= df)]


def size_fit(samples: tuple[Sample, ...]) -> tuple[float, float, float] | None:
    """Least squares ``time = a + b × bytes`` and its R², when the sizes differ enough."""
    pts = [(float(s.input_bytes), s.seconds) for s in samples if s.input_bytes is not None]
    if len(pts) < MIN_SAMPLES:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    if max(xs) < SIZE_SPREAD * max(min(xs), 1.0):
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    a = my - b * mx
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in pts)
    r2 = 1.0 - ss_res / syy if syy > 0 else 0.0
    return a, b, r2


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default, 'inclusive')."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def duration(seconds: float) -> str:
    """A length of time to the second: "42 s", "12 min 5 s", "5 h 12 min 3 s", "2 d 3 h 0 min"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min {s % 60} s"
    return f"{s // 86400} d {s % 86400 // 3600} h {s % 3600 // 60} min"


def percent(share: float) -> str:
    """A share as a percentage, with two significant digits when under 0.1 %."""
    return f"{share:.1%}" if share >= 0.001 or share == 0 else f"{share * 100:.2g}%"


def hours(value: float) -> str:
    return f"{value:,.2f}" if value >= 0.01 or value == 0 else f"{value:.2g}"


def secs(value: float) -> str:
    return f"{value:.3g} s"


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def plural(count: int, word: str, many: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else many or word + 's'}"
