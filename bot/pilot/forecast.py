"""The volume's forecast from the pilot's measurements: time, finish, lease fit, card-hours.

A pure function: ``forecast(ForecastInputs) -> Forecast``, no I/O, money in Decimal. Every
figure carries the formula that produced it, so a reader can check it by hand. Where the
pilot cannot support a figure (no per-item times, fewer than ``MIN_SAMPLES`` accepted
items), the forecast says so instead of inventing a number. docs/forecast.md explains each
figure and how to read the range.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, NamedTuple

MIN_SAMPLES = 5            # accepted items with a per-item time needed for a forecast
MIN_R2 = 0.5               # below this, time does not follow size well enough to use the fit
SIZE_SPREAD = 2.0          # sizes "differ" when the largest is at least this x the smallest
LOW_SHARE = 0.05           # under this share of the rented card-hours: maybe rented too much
MEMORY_TIGHT = 0.9         # peak over this fraction of the card's memory: say so
CENT = Decimal("0.01")


class ItemOutcome(NamedTuple):
    """One recorded item.done, as the forecast and the report read it (no JSON)."""

    id: str
    status: str | None
    ts: str | None
    elapsed_s: float | None
    input_bytes: int | None


@dataclass(frozen=True)
class Sample:
    """One accepted pilot item: its measured seconds and its input's size."""

    seconds: float
    input_bytes: int | None = None


@dataclass(frozen=True)
class ForecastInputs:
    samples: tuple[Sample, ...]
    accepted: int
    volume_count: int
    rented_cards: int
    cards_per_lot: int
    lots: int
    days: int
    lot_price_usd_per_day: Decimal
    now: datetime
    task_kind: str = "classify"
    command: bool = False
    volume_bytes: int | None = None
    volume_max_bytes: int | None = None
    volume_where: str = ""
    healthy_cards: int | None = None
    cards_per_worker: int = 1
    nodes: int = 1
    peak_memory_gib: float | None = None
    card_memory_gib: float | None = None
    lease_starts_at: datetime | None = None


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    value: str
    formula: str

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "label": self.label, "value": self.value,
                "formula": self.formula}


@dataclass(frozen=True)
class Forecast:
    possible: bool
    reason: str | None = None
    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = ()
    fits: bool | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: seconds as numbers, money as exact decimal strings, times as ISO."""
        return {"possible": self.possible, "reason": self.reason, "fits": self.fits,
                "figures": [f.to_dict() for f in self.figures], "notes": list(self.notes),
                **self.numbers}

    def figure(self, key: str) -> Figure:
        return next(f for f in self.figures if f.key == key)


def forecast(inp: ForecastInputs) -> Forecast:
    """The forecast, or an explanation of why the pilot cannot support one."""
    refusal = _refusal(inp)
    if refusal is not None:
        return Forecast(possible=False, reason=refusal)
    figures: list[Figure] = []
    notes: list[str] = []
    numbers: dict[str, Any] = {"volume_count": inp.volume_count,
                               "volume_bytes": inp.volume_bytes}
    size = f", {inp.volume_bytes:,} B" if inp.volume_bytes is not None else ", size unknown"
    figures.append(Figure("volume", "Volume inputs", f"{inp.volume_count:,} items{size}",
                          f"listed{_where(inp) or ' from volume.inputs'}"))
    per_item = _per_item(inp, figures, notes, numbers)
    workers, cards_used = _workers(inp, figures)
    numbers.update(workers=workers, cards_used=cards_used)
    if workers < 1:
        return Forecast(possible=False, reason=figures[-1].formula + ": no worker can run")
    t50, t90 = per_item
    low_s = inp.volume_count * t50 / workers
    high_s = inp.volume_count * t90 / workers
    items = f"{inp.volume_count:,} items"
    figures.append(Figure("wall", "Wall time of the volume",
                          f"{duration(low_s)} – {duration(high_s)}",
                          f"{items} × {secs(t50)} p50 ÷ {plural(workers, 'worker')} = "
                          f"{duration(low_s)}; × {secs(t90)} p90 = {duration(high_s)}"))
    numbers.update(low_s=round(low_s, 3), high_s=round(high_s, 3))
    fits = _lease(inp, low_s, high_s, figures, notes, numbers)
    _card_hours(inp, low_s, high_s, cards_used, figures, notes, numbers)
    _memory(inp, figures, notes)
    return Forecast(possible=True, figures=tuple(figures), notes=tuple(notes), fits=fits,
                    numbers=numbers)


def _refusal(inp: ForecastInputs) -> str | None:
    if inp.task_kind == "train" and not inp.samples:
        return ("a training pilot records no per-item time: the volume cannot be forecast "
                "from it")
    if inp.command and not inp.samples:
        return ("the command reported no per-item time (\"elapsed_s\" in its results): "
                "no forecast rather than a guess")
    if not inp.samples:
        return "the pilot recorded no per-item time: no forecast rather than a guess"
    if len(inp.samples) < MIN_SAMPLES:
        return (f"only {plural(len(inp.samples), 'accepted item')} with a measured time (of "
                f"{inp.accepted} accepted): a forecast needs at least {MIN_SAMPLES}")
    if inp.volume_count < 1:
        return f"the volume lists no inputs{_where(inp)}: nothing to forecast"
    return None


def _per_item(inp: ForecastInputs, figures: list[Figure], notes: list[str],
              numbers: dict[str, Any]) -> tuple[float, float]:
    """Per-item seconds at p50 and p90, at the volume's mean size when the fit holds."""
    times = [s.seconds for s in inp.samples]
    p50, p90 = quantile(times, 0.5), quantile(times, 0.9)
    n = len(times)
    figures.append(Figure("per_item", "Per-item time (pilot)", f"{secs(p50)} p50, {secs(p90)} p90",
                          f"median and 90th percentile of {n} accepted items' measured times"))
    numbers.update(samples=n, p50_s=p50, p90_s=p90)
    fit = size_fit(inp.samples)
    if fit is None:
        return p50, p90
    a, b, r2 = fit
    numbers["fit"] = {"intercept_s": a, "slope_s_per_byte": b, "r2": round(r2, 4)}
    line = f"time = {secs(a)} + {b * 1000:.4g} ms/KB × size, R² = {r2:.2f}"
    if r2 < MIN_R2 or b <= 0 or not inp.volume_bytes:
        why = ("the volume's sizes are unknown" if not inp.volume_bytes and r2 >= MIN_R2 and b > 0
               else f"time does not follow size well enough (R² {r2:.2f} < {MIN_R2})")
        figures.append(Figure("fit", "Time against size", f"R² = {r2:.2f} (not used)",
                              f"least squares over {n} items: {line}; {why}: the range uses "
                              "the per-item p50/p90"))
        return p50, p90
    residuals = [s.seconds - (a + b * float(s.input_bytes or 0)) for s in inp.samples]
    mean_v = inp.volume_bytes / inp.volume_count
    base = a + b * mean_v
    t50 = max(0.0, base + quantile(residuals, 0.5))
    t90 = max(t50, base + quantile(residuals, 0.9))
    figures.append(Figure("fit", "Time against size", f"R² = {r2:.2f} (used)",
                          f"least squares over {n} items: {line}; at the volume's mean "
                          f"{mean_v:,.0f} B: {secs(t50)} p50, {secs(t90)} p90 "
                          "(fit + the residuals' p50/p90)"))
    numbers.update(item_p50_s=t50, item_p90_s=t90)
    return t50, t90


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


def _workers(inp: ForecastInputs, figures: list[Figure]) -> tuple[int, int]:
    """Workers the volume runs: healthy cards ÷ cards per worker, on each node."""
    nodes = max(1, inp.nodes)
    cpw = max(1, inp.cards_per_worker)
    if inp.healthy_cards is not None:
        cards, source = min(inp.healthy_cards, inp.rented_cards), "healthy"
    else:
        cards, source = inp.rented_cards, "rented (no healthy-card count measured)"
    per_node = cards // nodes
    workers = nodes * (per_node // cpw)
    figures.append(Figure("workers", "Workers", str(workers),
                          f"{plural(cards, 'card')} {source} ÷ {plural(nodes, 'node')} = "
                          f"{per_node} per node; ⌊{per_node} ÷ {cpw} per worker⌋ × "
                          f"{plural(nodes, 'node')} = {plural(workers, 'worker')}"))
    return workers, workers * cpw


def _lease(inp: ForecastInputs, low_s: float, high_s: float, figures: list[Figure],
           notes: list[str], numbers: dict[str, Any]) -> bool | None:
    start, began = inp.now, "approved now"
    if inp.lease_starts_at is not None and inp.lease_starts_at > start:
        start, began = inp.lease_starts_at, "the lease starts"
    start = start.replace(microsecond=0)  # every time to the second
    finish_low = start + timedelta(seconds=round(low_s))
    finish_high = start + timedelta(seconds=round(high_s))
    figures.append(Figure("finish", "Estimated finish",
                          f"{stamp(finish_low)} – {stamp(finish_high)}",
                          f"{stamp(start)} ({began}) + {duration(low_s)} – {duration(high_s)}"))
    numbers.update(start=start.isoformat(), finish_low=finish_low.isoformat(),
                   finish_high=finish_high.isoformat())
    if inp.lease_starts_at is None:
        notes.append("lease.starts_at is not set: the lease's end, and whether the volume "
                     "fits in it, are unknown")
        return None
    end = inp.lease_starts_at + timedelta(days=inp.days)
    margin = (end - finish_high).total_seconds()
    figures.append(Figure("lease_end", "Lease ends", stamp(end),
                          f"lease.starts_at {stamp(inp.lease_starts_at)} + "
                          f"{plural(inp.days, 'day')}"))
    sign = "" if margin >= 0 else "−"
    figures.append(Figure("margin", "Margin", f"{sign}{duration(abs(margin))}",
                          f"lease end {stamp(end)} − high finish {stamp(finish_high)}"))
    numbers.update(lease_end=end.isoformat(), margin_s=margin)
    if margin < 0:
        notes.append(f"the high estimate ends {duration(-margin)} after the lease: approving "
                     "needs an override reason")
    return margin >= 0


def _card_hours(inp: ForecastInputs, low_s: float, high_s: float, cards_used: int,
                figures: list[Figure], notes: list[str], numbers: dict[str, Any]) -> None:
    rented_h = inp.rented_cards * inp.days * 24
    used_low, used_high = low_s * cards_used / 3600, high_s * cards_used / 3600
    share_low, share_high = used_low / rented_h, used_high / rented_h
    figures.append(Figure("share", "Share of the rented card-hours",
                          f"{percent(share_low)} – {percent(share_high)}",
                          f"{hours(used_low)} – {hours(used_high)} card-h "
                          f"({plural(cards_used, 'card')} × wall time) ÷ {rented_h:,} card-h "
                          f"rented ({plural(inp.rented_cards, 'card')} × "
                          f"{plural(inp.days, 'day')} × 24 h)"))
    per_card_hour = inp.lot_price_usd_per_day / (inp.cards_per_lot * 24)
    cost_low = card_cost(low_s, cards_used, inp.lot_price_usd_per_day, inp.cards_per_lot)
    cost_high = card_cost(high_s, cards_used, inp.lot_price_usd_per_day, inp.cards_per_lot)
    figures.append(Figure("cost", "Worth of the card-hours used",
                          f"{cost_low} – {cost_high} USD",
                          f"{hours(used_low)} – {hours(used_high)} card-h × "
                          f"{per_card_hour.quantize(Decimal('0.0001'), ROUND_HALF_UP)} USD per "
                          f"card-hour ({inp.lot_price_usd_per_day} USD per lot-day ÷ "
                          f"{plural(inp.cards_per_lot, 'card')} ÷ 24 h); the lease is paid "
                          "whole either way"))
    numbers.update(share_low=round(share_low, 6), share_high=round(share_high, 6),
                   rented_card_hours=rented_h, cost_low_usd=str(cost_low),
                   cost_high_usd=str(cost_high))
    if share_high < LOW_SHARE:
        notes.append(f"the volume uses under {LOW_SHARE:.0%} of the rented card-hours "
                     f"({percent(share_high)} at the high estimate): the lease may be larger than "
                     "this job needs")


def card_cost(seconds: float, cards: int, lot_price: Decimal, cards_per_lot: int) -> Decimal:
    """What ``cards`` for ``seconds`` are worth at the lease's price, to the cent."""
    value = Decimal(repr(seconds)) * cards * lot_price / (cards_per_lot * 86400)
    return value.quantize(CENT, ROUND_HALF_UP)


def _memory(inp: ForecastInputs, figures: list[Figure], notes: list[str]) -> None:
    peak, card = inp.peak_memory_gib, inp.card_memory_gib
    if peak is not None and card:
        share = peak / card
        figures.append(Figure("memory", "Peak memory vs the card", f"{share:.0%}",
                              f"{peak:.2f} GiB measured peak ÷ {card:g} GiB per card"))
        if share > MEMORY_TIGHT:
            notes.append(f"the pilot's memory peak is {share:.0%} of the card: larger inputs "
                         "in the volume may not fit")
    pilot_max = max((s.input_bytes or 0 for s in inp.samples), default=0)
    if inp.volume_max_bytes and pilot_max and inp.volume_max_bytes > pilot_max:
        notes.append(f"the volume's largest input ({inp.volume_max_bytes:,} B) is larger than "
                     f"the pilot's largest ({pilot_max:,} B): time and memory at that size were "
                     "not measured")


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


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _where(inp: ForecastInputs) -> str:
    return f" ({inp.volume_where})" if inp.volume_where else ""
